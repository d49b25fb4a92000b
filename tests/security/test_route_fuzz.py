"""Schemathesis fuzzes every route of the app's OpenAPI schema against a real server: no 5xx, ever."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from tests.server.raw_http import call

MAX_TOKENS = 4
REFUSED = (
    "suffix", "best_of",
)  # fmt: skip


def steer(case, real_model: bool) -> None:
    """Keep generations short, and send half of them to a real adapter so the engine sees fuzzed options."""
    body = case.body
    if not isinstance(body, dict) or "model" not in body:
        return
    for field in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = body.get(field)
        if value is None or (
            isinstance(value, (int, float)) and not isinstance(value, bool) and value > MAX_TOKENS
        ):
            body[field] = MAX_TOKENS
    if real_model:
        body["model"] = "tiny-r4-qv"
        for field in REFUSED:  # options answered with a clear 400 would hide the engine from the fuzzer
            body.pop(field, None)


def fuzz(operation, mode: GenerationMode) -> None:
    label = f"{operation.method.upper()} {operation.path}"

    @given(case=operation.as_strategy(mode), real_model=st.booleans())
    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def run(case, real_model):
        steer(case, real_model)
        note(f"{label} {case.body!r}")
        case.validate_response(case.call(), checks=[not_a_server_error])

    run()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_route_answers_a_server_error(serve, engine, mode):
    server = serve(max_body_bytes=64 * 1024)
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/load_lora_adapter",
        "/tokenize",
        "/detokenize",
    }
    for operation in operations:
        if mode is GenerationMode.NEGATIVE and operation.method != "post":
            continue  # only request bodies can break the schema; the GET routes take no body
        fuzz(operation, mode)
    statuses = [record.status for record in server.request_log.records()]
    if mode is GenerationMode.POSITIVE:
        assert statuses.count(200) >= 1, statuses  # fuzzed options reached the engine, not only 404s
    status, _, body = call(server.url, "GET", "/v1/models")
    assert status == 200 and len(body["data"]) == 9  # the engine and its adapters came through
