"""Slow, half-open and too many connections, and ambiguous body framing, against a real server."""

from __future__ import annotations

import contextlib
import json
import time

import pytest

from multilora_studio.server import ServerConfig
from tests.security.raw_sockets import get, open_socket, parse_response, read_response, read_to_close, trickle
from tests.server.raw_http import call
from tests.server_fixtures import GREEDY, client
from tests.waiting import wait_until

KEY = "sk-test-0123456789"
SHORT_S = 0.5  # the read timeouts the tests set: seconds, so nothing waits for the defaults
COMPLETION = json.dumps({"model": "tiny-r8-all", "prompt": "Hi", "max_tokens": 2}).encode()


def host_of(server) -> str:
    return server.url.removeprefix("http://")


def test_half_open_flood_leaves_health_up_and_is_closed(serve):
    server = serve(max_in_flight=1, header_timeout_s=SHORT_S, max_connections_per_client=500)
    flood = [open_socket(server.url) for _ in range(80)]  # connected, never send a byte
    try:
        for _ in range(3):  # idle connections count against no limit on requests
            assert call(server.url, "GET", "/health")[0] == 200
        assert all(read_to_close(sock) == b"" for sock in flood)  # closed by the server, silently
    finally:
        for sock in flood:
            sock.close()
    assert call(server.url, "GET", "/health")[0] == 200


def test_slowloris_head_is_closed_though_bytes_keep_coming(serve):
    server = serve(header_timeout_s=SHORT_S)
    with open_socket(server.url) as sock:
        sock.sendall(f"GET /health HTTP/1.1\r\nHost: {host_of(server)}\r\n".encode())
        # one header line every 0.1 s for 20 s: each byte is fresh, the head never ends
        assert trickle(sock, [b"X-Pad: 1\r\n"] * 200, 0.1), "the server waited for the whole trickle"
        status, headers, body = parse_response(read_to_close(sock))
    assert status == 408 and headers["connection"] == "close"
    assert body["error"]["code"] == "header_timeout"


@pytest.mark.parametrize("steady", [False, True], ids=["stalled", "steady-trickle"])
def test_slow_body_gets_408_and_runs_nothing(serve, steady):
    server = serve(body_timeout_s=SHORT_S)
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host_of(server)}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(COMPLETION)}\r\n\r\n"
    ).encode()
    with open_socket(server.url) as sock:
        sock.sendall(head + COMPLETION[:5])
        # the rest one byte every 0.2 s would take many times the timeout: bounded by total time
        pieces = [COMPLETION[i : i + 1] for i in range(5, len(COMPLETION) - 1)] if steady else []
        trickle(sock, pieces, 0.2)
        status, headers, body = parse_response(read_to_close(sock))
    assert status == 408 and headers["connection"] == "close"
    assert body["error"]["code"] == "body_timeout" and "body" in body["error"]["message"]
    assert server.request_log.records() == []


def test_connections_past_the_per_address_limit_are_refused_before_authentication(serve):
    server = serve(api_keys=(KEY,), max_connections_per_client=4, header_timeout_s=60)
    held = [open_socket(server.url) for _ in range(4)]
    try:
        with open_socket(server.url) as excess:  # answered as it opens: no request, no key needed
            status, headers, body = parse_response(read_to_close(excess))
        assert status == 429 and headers["connection"] == "close"
        assert body["error"]["code"] == "too_many_connections"
        with open_socket(server.url, source="127.0.0.2") as other:  # another address is not affected
            other.sendall(get("/health", host_of(server)))
            assert parse_response(read_response(other))[0] == 200
    finally:
        for sock in held:
            sock.close()
    wait_until(lambda: health_from_loopback(server), what="the closed connections to be released")
    assert call(server.url, "GET", "/v1/models", headers={"Authorization": f"Bearer {KEY}"})[0] == 200


def health_from_loopback(server) -> bool:
    with contextlib.suppress(OSError, ValueError, IndexError):
        return call(server.url, "GET", "/health")[0] == 200
    return False


def test_content_length_with_chunked_is_refused_and_closed(serve):
    server = serve()
    chunked = f"{len(COMPLETION):x}\r\n".encode() + COMPLETION + b"\r\n0\r\n\r\n"
    smuggled = get("/v1/models", host_of(server))
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host_of(server)}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(chunked)}\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    with open_socket(server.url) as sock:
        sock.sendall(head + chunked + smuggled)
        data = read_to_close(sock)
    status, headers, body = parse_response(data)
    assert status == 400 and headers["connection"] == "close"
    assert body["error"]["code"] == "conflicting_framing"
    assert "Content-Length" in body["error"]["message"] and "Transfer-Encoding" in body["error"]["message"]
    assert data.count(b"HTTP/1.1 ") == 1  # the request after the body was never answered
    assert server.request_log.records() == []


def test_stream_and_keep_alive_outlast_the_read_timeouts(serve):
    server = serve(header_timeout_s=SHORT_S, body_timeout_s=SHORT_S)
    api = client(server)
    stream = api.completions.create(model="tiny-r8-all", prompt="Hi", stream=True, max_tokens=8, **GREEDY)
    chunks = iter(stream)
    first = next(chunks)
    time.sleep(4 * SHORT_S)  # the client idles mid-stream: a request that was read is never timed out
    text = first.choices[0].text + "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)
    whole = api.completions.create(model="tiny-r8-all", prompt="Hi", max_tokens=8, **GREEDY)
    assert text == whole.choices[0].text and whole.usage.completion_tokens == 8


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("header_timeout_s", 0),
        ("header_timeout_s", float("nan")),
        ("body_timeout_s", -1.0),
        ("body_timeout_s", True),
        ("max_connections_per_client", 0),
        ("max_connections_per_client", 2.5),
    ],
)
def test_connection_settings_are_validated(field, value):
    with pytest.raises(ValueError, match=field):
        ServerConfig(**{field: value})
