"""Keys, limits, body size, Host check, CORS and the error shape, against a real server."""

from __future__ import annotations

import json

import openai
import pytest

from tests.server.raw_http import call, post_json
from tests.server_fixtures import GREEDY, client
from tests.threads import CheckedThread
from tests.waiting import wait_until

KEY = "sk-test-0123456789"
LONG = {"max_tokens": 1000, **GREEDY}  # a stream that stays open for seconds unless closed


def in_flight(server) -> int:
    """Engine requests the server holds reservations for."""
    return server.state.admission.in_flight


def assert_openai_error(body, code=None):
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["message"]
    if code is not None:
        assert body["error"]["code"] == code, body


def test_malformed_json_is_a_400_and_the_server_keeps_serving(serve):
    server = serve()
    status, _, body = call(
        server.url,
        "POST",
        "/v1/completions",
        b'{"model": "x", "prompt": ',
        {"Content-Type": "application/json"},
    )
    assert status == 400
    assert_openai_error(body, "invalid_json")
    status, _, body = post_json(server.url, "/v1/completions", {"model": "tiny-r4-qv"})
    assert status == 400 and body["error"]["param"] == "prompt"
    status, _, body = post_json(
        server.url,
        "/v1/chat/completions",
        {"model": "tiny-r4-qv", "messages": [{"role": "wizard", "content": "hi"}]},
    )
    assert status == 400 and body["error"]["param"] == "messages.0.role"
    status, _, body = post_json(server.url, "/v1/completions", ["not", "an", "object"])
    assert status == 400
    assert_openai_error(body)
    text = client(server).completions.create(model="tiny-r4-qv", prompt="Hi", max_tokens=3, **GREEDY)
    assert text.usage.completion_tokens == 3


def test_unknown_route_and_method_use_the_error_shape(serve):
    server = serve()
    status, _, body = call(server.url, "GET", "/v1/nothing-here")
    assert status == 404
    assert_openai_error(body)
    status, _, body = call(server.url, "GET", "/v1/completions")
    assert status == 405
    assert_openai_error(body)


def test_oversize_bodies_are_refused(serve):
    server = serve(max_body_bytes=4096)
    big = {"model": "tiny-r4-qv", "prompt": "x" * 5000}
    status, _, body = post_json(server.url, "/v1/completions", big)
    assert status == 413
    assert_openai_error(body)
    payload = json.dumps(big).encode()
    chunks = [payload[i : i + 1000] for i in range(0, len(payload), 1000)]
    status, _, body = call(
        server.url, "POST", "/v1/completions", chunks, {"Content-Type": "application/json"}
    )
    assert status == 413
    assert_openai_error(body)
    small = [json.dumps({"model": "tiny-r4-qv", "prompt": "Hi", "max_tokens": 2}).encode()]
    status, _, body = call(server.url, "POST", "/v1/completions", small, {"Content-Type": "application/json"})
    assert status == 200 and body["usage"]["completion_tokens"] == 2


def test_api_keys_guard_every_route_but_health(serve):
    server = serve(api_keys=(KEY, "sk-second-key-000"))
    with pytest.raises(openai.AuthenticationError) as wrong:
        client(server, api_key="sk-wrong-key-123").completions.create(model="tiny-r4-qv", prompt="Hi")
    assert wrong.value.body["code"] == "invalid_api_key"
    assert len(client(server, api_key=KEY).models.list().data) == 9
    assert len(client(server, api_key="sk-second-key-000").models.list().data) == 9
    for path in ("/metrics", "/openapi.json", "/v1/models"):
        status, headers, body = call(server.url, "GET", path)
        assert status == 401 and headers["www-authenticate"] == "Bearer", path
        assert_openai_error(body, "invalid_api_key")
    assert call(server.url, "GET", "/health")[0] == 200
    assert call(server.url, "GET", "/metrics", headers={"Authorization": f"Bearer {KEY}"})[0] == 200


def test_tokens_per_minute_limit_answers_429_with_retry_after(serve):
    server = serve(api_keys=(KEY, "sk-other-key-0000"), tokens_per_minute_per_key=30)
    api = client(server, api_key=KEY)
    used = 0
    with pytest.raises(openai.RateLimitError) as caught:
        for _ in range(5):
            used += api.completions.create(
                model="tiny-r4-qv", prompt="Hi", max_tokens=12, **GREEDY
            ).usage.total_tokens
    assert 30 - 16 < used <= 30  # refused once the next request (12 + its prompt) could overshoot
    assert caught.value.body["code"] == "rate_limit_exceeded"
    retry_after = int(caught.value.response.headers["retry-after"])
    assert 1 <= retry_after <= 60
    other = client(server, api_key="sk-other-key-0000")  # budgets are per key
    assert (
        other.completions.create(model="tiny-r4-qv", prompt="Hi", max_tokens=2).usage.completion_tokens == 2
    )


def test_concurrency_limit_per_key(serve):
    server = serve(max_concurrent_per_key=1)
    api = client(server)
    stream = api.completions.create(model="tiny-r8-all", prompt="Hi", stream=True, **LONG)
    next(iter(stream))
    with pytest.raises(openai.RateLimitError) as caught:
        api.completions.create(model="tiny-r8-all", prompt="Hi", max_tokens=2)
    assert caught.value.body["code"] == "concurrency_limit_exceeded"
    assert caught.value.response.headers["retry-after"] == "1"
    stream.close()
    wait_until(lambda: in_flight(server) == 0, what="the closed stream's reservation to be returned")
    assert api.completions.create(model="tiny-r8-all", prompt="Hi", max_tokens=2).usage.completion_tokens == 2


def test_a_key_back_before_its_retry_after_is_answered_when_it_was_told(serve):
    server = serve(api_keys=(KEY, "sk-other-key-0000"), max_concurrent_per_key=1)
    admission = server.state.admission
    api, other = client(server, api_key=KEY), client(server, api_key="sk-other-key-0000")
    stream = api.completions.create(model="tiny-r8-all", prompt="Hi", stream=True, **LONG)
    next(iter(stream))
    refused: list[openai.RateLimitError] = []

    def over_the_limit() -> None:
        for _ in range(2):  # the first is refused at once; the second, sent at once, comes too soon
            with pytest.raises(openai.RateLimitError) as caught:
                api.completions.create(model="tiny-r8-all", prompt="Hi", max_tokens=2)
            refused.append(caught.value)

    flood = CheckedThread(over_the_limit, name="over-the-limit")
    flood.start()
    wait_until(lambda: admission.held("key-1") == 1, what="the early request's refusal to be held")
    assert len(refused) == 1  # held: not answered yet
    served = other.completions.create(model="tiny-r4-qv", prompt="Hi", max_tokens=2)  # other keys are not
    assert served.usage.completion_tokens == 2
    flood.join()
    assert [error.body["code"] for error in refused] == ["concurrency_limit_exceeded"] * 2
    assert admission.held("key-1") == 0
    stream.close()


def test_full_server_answers_503_at_once(serve, engine):
    server = serve(max_in_flight=2)
    api = client(server)
    streams = [api.completions.create(model="tiny-r4-qv", prompt="Hi", stream=True, **LONG) for _ in range(2)]
    for stream in streams:
        next(iter(stream))
    with pytest.raises(openai.InternalServerError) as caught:
        api.chat.completions.create(
            model="tiny-r4-qv", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
    # refused while both streams still ran, before any work: not queued behind them
    assert in_flight(server) == 2 and [r.status for r in server.request_log.records()] == [503]
    assert caught.value.status_code == 503 and caught.value.body["code"] == "server_overloaded"
    with pytest.raises(openai.BadRequestError):  # could never fit: refused, not queued
        api.completions.create(model="tiny-r4-qv", prompt="Hi", max_tokens=2, n=3)
    for stream in streams:
        stream.close()
    wait_until(lambda: in_flight(server) == 0, what="the closed streams' reservations to be returned")
    assert api.completions.create(model="tiny-r4-qv", prompt="Hi", max_tokens=2).usage.completion_tokens == 2


@pytest.mark.parametrize(
    ("host", "allowed", "expected"),
    [
        ("localhost:{port}", (), 200),
        ("127.0.0.1:{port}", (), 200),
        ("[::1]:{port}", (), 200),
        ("evil.example:{port}", (), 403),
        ("evil.example", (), 403),
        ("127.0.0.1.evil.example:{port}", (), 403),
        ("studio.lan:{port}", ("studio.lan",), 200),
    ],
)
def test_host_header_check_on_loopback(serve, host, allowed, expected):
    server = serve(allowed_hosts=allowed)
    port = server.url.rsplit(":", 1)[1]
    status, _, body = call(server.url, "GET", "/v1/models", headers={"Host": host.format(port=port)})
    assert status == expected
    if expected == 403:
        assert_openai_error(body, "host_not_allowed")


def test_cors_is_off_unless_configured(serve):
    preflight = {
        "Origin": "http://app.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
    }
    status, headers, _ = call(serve().url, "OPTIONS", "/v1/completions", headers=preflight)
    assert "access-control-allow-origin" not in headers and status != 200
    _, headers, _ = call(serve().url, "GET", "/v1/models", headers={"Origin": "http://app.example"})
    assert "access-control-allow-origin" not in headers
    server = serve(cors_origins=("http://app.example",), api_keys=(KEY,))
    status, headers, _ = call(server.url, "OPTIONS", "/v1/completions", headers=preflight)
    assert status == 200 and headers["access-control-allow-origin"] == "http://app.example"
    status, headers, _ = call(
        server.url, "OPTIONS", "/v1/completions", headers=preflight | {"Origin": "http://x.y"}
    )
    assert status == 400 and "access-control-allow-origin" not in headers


def test_cors_lets_the_openai_js_client_send_its_headers(serve):
    """The openai npm package's preflight names its x-stainless-* headers; a header outside the
    list is still refused."""
    server = serve(cors_origins=("http://app.example",), api_keys=(KEY,))
    sent = ",".join(
        ["authorization", "content-type", "x-stainless-os", "x-stainless-lang", "x-stainless-retry-count"]
    )
    preflight = {
        "Origin": "http://app.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": sent,
    }
    status, headers, _ = call(server.url, "OPTIONS", "/v1/chat/completions", headers=preflight)
    assert status == 200
    allowed = {h.strip().lower() for h in headers["access-control-allow-headers"].split(",")}
    assert set(sent.split(",")) <= allowed
    odd = preflight | {"Access-Control-Request-Headers": "x-not-a-client-header"}
    status, _, _ = call(server.url, "OPTIONS", "/v1/chat/completions", headers=odd)
    assert status == 400


@pytest.mark.parametrize(
    "options",
    [
        {"temperature": 1e-30},
        {"top_p": 5e-324, "temperature": 1.5},
        {"temperature": 1.0, "top_k": 1 << 20, "seed": (1 << 63) - 1},
    ],
)
def test_extreme_sampling_values_never_break_the_engine(serve, options):
    server = serve()
    payload = {"model": "tiny-r16-vup", "prompt": "Hi", "max_tokens": 5, "ignore_eos": True} | options
    status, _, body = post_json(server.url, "/v1/completions", payload)
    assert status == 200 and body["usage"]["completion_tokens"] == 5
    status, _, body = post_json(server.url, "/v1/completions", payload | {"seed": 1 << 64})
    assert status == 400 and body["error"]["param"] == "seed"
    api = client(server)
    assert (
        api.completions.create(
            model="tiny-r16-vup", prompt="Hi", max_tokens=3, **GREEDY
        ).usage.completion_tokens
        == 3
    )


def test_sequences_per_request_limit_names_the_real_cause(serve):
    server = serve(max_sequences_per_request=3)
    api = client(server)
    assert len(api.completions.create(model="tiny-r4-qv", prompt=["a", "b", "c"], max_tokens=1).choices) == 3
    with pytest.raises(openai.BadRequestError) as prompts:
        api.completions.create(model="tiny-r4-qv", prompt=["a", "b", "c", "d"], max_tokens=1)
    error = prompts.value.body
    assert error["param"] == "prompt" and "4 prompts x n=1" in error["message"]
    assert "--max-sequences-per-request" in error["message"] and "at most 3" in error["message"]
    with pytest.raises(openai.BadRequestError) as choices:
        api.completions.create(model="tiny-r4-qv", prompt=["a", "b"], max_tokens=1, n=2)
    assert choices.value.body["param"] == "n" and "2 prompts x n=2" in choices.value.body["message"]
    with pytest.raises(openai.BadRequestError) as chat:
        api.chat.completions.create(
            model="tiny-r4-qv", messages=[{"role": "user", "content": "Hi"}], max_tokens=1, n=4
        )
    assert chat.value.body["param"] == "n" and "1 prompt x n=4" in chat.value.body["message"]
