"""The request-field table: complete for OpenAI's params, enforced by the server, shown in the docs."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from openai.types import completion_create_params as completion_params
from openai.types.chat import completion_create_params as chat_params
from openai.types.responses import response_create_params as responses_params

from multilora_studio.server.request_fields import (
    CHAT,
    COMPLETIONS,
    FIELDS,
    REFUSED,
    RESPONSES,
    field_table,
    fields_of,
)
from multilora_studio.server.responses_request import ResponsesRequest
from multilora_studio.server.schemas import ChatCompletionRequest, CompletionRequest

DOCS = Path(__file__).resolve().parents[2] / "docs" / "server.md"
START, END = "<!-- request-fields:start -->\n", "<!-- request-fields:end -->"
MODEL = "tiny-r4-qv"
OPENAI_PARAMS = {
    CHAT: (chat_params.CompletionCreateParamsStreaming, chat_params.CompletionCreateParamsNonStreaming),
    COMPLETIONS: (
        completion_params.CompletionCreateParamsStreaming,
        completion_params.CompletionCreateParamsNonStreaming,
    ),
    RESPONSES: (
        responses_params.ResponseCreateParamsStreaming,
        responses_params.ResponseCreateParamsNonStreaming,
    ),
}
MODELS = {CHAT: ChatCompletionRequest, COMPLETIONS: CompletionRequest, RESPONSES: ResponsesRequest}
BASE_BODIES = {
    CHAT: ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}),
    COMPLETIONS: ("/v1/completions", {"prompt": "Hi", "max_tokens": 1}),
    RESPONSES: ("/v1/responses", {"input": "Hi", "max_output_tokens": 1}),
}


@pytest.mark.parametrize("route", list(OPENAI_PARAMS))
def test_every_openai_request_field_is_in_the_table(route):
    """A field a new openai release adds fails here until the table decides on it."""
    names = set().union(*(params.__annotations__ for params in OPENAI_PARAMS[route]))
    assert names - {"stream"}, "the openai package's params moved"
    assert sorted(names - set(fields_of(route))) == []


@pytest.mark.parametrize("route", list(MODELS))
def test_every_declared_field_is_in_the_table_once(route):
    assert sorted(set(MODELS[route].model_fields) - set(fields_of(route))) == []
    names = [entry.name for entry in FIELDS if route in entry.routes]
    assert len(names) == len(set(names))


def test_refused_examples_are_not_harmless():
    for entry in FIELDS:
        if entry.status == REFUSED:
            assert entry.example is not None and entry.example not in entry.harmless, entry.name


def test_the_docs_show_the_table():
    text = DOCS.read_text()
    assert START in text and END in text, "docs/server.md lacks the request-field markers"
    shown = text.split(START, 1)[1].split(END, 1)[0]
    assert shown == field_table(), "regenerate docs/server.md's table from request_fields.field_table()"


REFUSALS = [(route, entry) for entry in FIELDS if entry.status == REFUSED for route in entry.routes]


def _post(server, route, extra):
    path, body = BASE_BODIES[route]
    return httpx.post(f"{server.url}{path}", json={"model": MODEL, **body, **extra}, timeout=60)


@pytest.mark.parametrize(("route", "entry"), REFUSALS, ids=[f"{r}-{e.name}" for r, e in REFUSALS])
def test_refused_fields_are_400_naming_them_and_harmless_values_pass(serve, route, entry):
    server = serve()
    refused = _post(server, route, {entry.name: entry.example})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == entry.name, refused.text
    for value in entry.harmless:
        assert _post(server, route, {entry.name: value}).status_code == 200, (entry.name, value)


@pytest.mark.parametrize("route", list(BASE_BODIES))
def test_fields_in_no_schema_are_ignored(serve, route):
    assert _post(serve(), route, {"x_vendor_hint": {"any": 1}}).status_code == 200
