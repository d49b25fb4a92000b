"""Plain HTTP calls for what the openai client cannot send: bad JSON, odd headers, early hang-ups."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterable
from urllib.parse import urlsplit


def connect(url: str, timeout: float = 30) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)


def call(
    url: str,
    method: str,
    path: str,
    body: bytes | Iterable[bytes] | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], object]:
    """Status, headers (lower-case names) and the JSON body (or text when it is not JSON)."""
    conn = connect(url)
    try:
        skip_host = headers is not None and "Host" in headers
        conn.putrequest(method, path, skip_host=skip_host, skip_accept_encoding=True)
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        if isinstance(body, bytes):
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
        elif body is not None:
            conn.putheader("Transfer-Encoding", "chunked")
            conn.endheaders()
            for chunk in body:
                conn.send(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            conn.send(b"0\r\n\r\n")
        else:
            conn.endheaders()
        response = conn.getresponse()
        data = response.read()
        found = {k.lower(): v for k, v in response.getheaders()}
        try:
            return response.status, found, json.loads(data)
        except ValueError:
            return response.status, found, data.decode(errors="replace")
    finally:
        conn.close()


def post_json(url: str, path: str, payload: object, headers: dict[str, str] | None = None):
    return call(
        url,
        "POST",
        path,
        json.dumps(payload).encode(),
        {"Content-Type": "application/json"} | (headers or {}),
    )
