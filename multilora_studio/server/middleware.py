"""Plain ASGI guards in front of the routes: requests in progress, framing, Host, API keys, body size."""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from multilora_studio.server.api_keys import ApiKey
from multilora_studio.server.errors import ApiError, send_error
from multilora_studio.server.exposure import is_loopback
from multilora_studio.server.state import API_KEY_SCOPE

OPEN_PATHS = frozenset({"/health"})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


def host_name(header: str) -> str:
    """The host part of a Host header: ``[::1]:8000`` -> ``::1``, ``example.com:80`` -> ``example.com``."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class RequestCap:
    """At most ``limit`` requests in progress (idle connections do not count); past it a 503 at once."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.active = 0  # one event loop: no lock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.active >= self.limit:
            message = f"the server is busy: {self.limit} requests are in progress"
            await send_error(send, ApiError(503, message, "server_busy", headers={"Retry-After": "1"}))
            return
        self.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.active -= 1


class FramingCheck:
    """Refuse a request with both Content-Length and Transfer-Encoding (RFC 9112 6.1), then close.

    Front ends may disagree on which header frames the body: that is how a second request is
    smuggled inside the first one's body.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and _header(scope, b"content-length") is not None
            and _header(scope, b"transfer-encoding") is not None
        ):
            message = "the request has both Content-Length and Transfer-Encoding headers; send only one"
            error = ApiError(400, message, "conflicting_framing", headers={"Connection": "close"})
            await send_error(send, error)
            return
        await self.app(scope, receive, send)


class HostCheck:
    """Refuse requests whose Host is not one of ours: a DNS-rebinding page cannot reach the server.

    ``names`` are the bound address's names and the configured extra hosts
    (``ServerConfig.host_names``); any loopback address is accepted too.
    """

    def __init__(self, app: ASGIApp, names: Iterable[str]) -> None:
        self.app = app
        self.names = {name.lower() for name in names}

    def accepts(self, header: str | None) -> bool:
        if not header:
            return False
        name = host_name(header)
        return name in self.names or is_loopback(name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self.accepts(_header(scope, b"host")):
            message = "the Host header names a host this server does not serve (see --allowed-hosts)"
            await send_error(send, ApiError(403, message, "host_not_allowed"))
            return
        await self.app(scope, receive, send)


class ApiKeyAuth:
    """``Authorization: Bearer KEY`` on every route but /health; puts the caller's ``ApiKey`` in the scope."""

    def __init__(self, app: ASGIApp, keys: Iterable[ApiKey]) -> None:
        self.app = app
        self.keys = [(key.secret.encode(), key) for key in keys]

    def key_of(self, header: str | None) -> ApiKey | None:
        if not header or not header.lower().startswith("bearer "):
            return None
        given = header[7:].strip().encode()
        found = None
        for secret, key in self.keys:  # compare against every key: timing says nothing about which matched
            if hmac.compare_digest(given, secret):
                found = key
        return found

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        header = _header(scope, b"authorization")
        key = self.key_of(header)
        if key is None:
            message = "invalid API key" if header else "missing API key: send 'Authorization: Bearer <key>'"
            error = ApiError(401, message, "invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
            await send_error(send, error)
            return
        scope[API_KEY_SCOPE] = key
        await self.app(scope, receive, send)


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than the limit of {limit} bytes")


class BodyLimit:
    """Refuse bodies over ``limit`` bytes: by Content-Length at once, or while a chunked body arrives."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _header(scope, b"content-length")
        if length is not None:
            if not length.strip().isdigit():
                await send_error(send, ApiError(400, "invalid Content-Length header", "invalid_request"))
                return
            if int(length) > self.limit:
                await send_error(send, ApiError(413, str(BodyTooLarge(self.limit).detail), "body_too_large"))
                return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        await self.app(scope, limited_receive, send)
