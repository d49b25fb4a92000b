"""Connection-level guards under the ASGI app: read timeouts, open connections per address and in all.

uvicorn's h11 protocol times out only idle keep-alive connections. This subclass also closes
a connection whose request head is not complete ``header_timeout_s`` after its first byte (or
after it opened), answers 408 to a body not complete ``body_timeout_s`` after its head, and
refuses a client address's connection past ``max_connections_per_client`` as soon as it opens,
before any request is read (and any connection past ``max_connections`` from all addresses
together, with a 503). A request that has been read is never timed out here, so a long
generation or a stream runs as long as it needs.
"""

from __future__ import annotations

import asyncio
import http
import json
from collections import Counter
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from multilora_studio.server.config import ServerConfig
from multilora_studio.server.errors import ApiError


def raw_response(error: ApiError) -> bytes:
    """``error`` as a whole HTTP/1.1 response that closes the connection, written outside h11's cycle."""
    payload = json.dumps(error.body()).encode()
    extra = "".join(f"{name.lower()}: {value}\r\n" for name, value in error.headers.items())
    head = (
        f"HTTP/1.1 {error.status} {http.HTTPStatus(error.status).phrase}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(payload)}\r\n"
        f"{extra}connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + payload


class ClientCounts:
    """Open connections per client address and in all, shared by one server's protocols (all on
    its event loop)."""

    def __init__(self, limit: int, total_limit: int) -> None:
        self.limit = limit
        self.total_limit = total_limit
        self.open: Counter[str] = Counter()
        self.total = 0

    def refusal(self, address: str) -> ApiError | None:
        """Count a new connection from ``address``; the answer that refuses it when over a limit."""
        if self.total >= self.total_limit:
            message = f"the server has too many open connections (the limit is {self.total_limit})"
            return ApiError(503, message, "too_many_connections", headers={"Retry-After": "1"})
        if self.open[address] >= self.limit:
            message = f"too many open connections from {address} (the limit is {self.limit})"
            return ApiError(429, message, "too_many_connections")
        self.open[address] += 1
        self.total += 1
        return None

    def release(self, address: str) -> None:
        self.open[address] -= 1
        self.total -= 1
        if self.open[address] <= 0:
            del self.open[address]


class GuardedH11Protocol(H11Protocol):
    """H11Protocol with read deadlines and the per-address limit (values set by ``guarded_protocol``)."""

    counts: ClientCounts
    header_timeout_s: float
    body_timeout_s: float

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.counted: str | None = None  # the address this connection counts against
        self.deadline: asyncio.TimerHandle | None = None
        self.awaiting: object | None = None  # h11.IDLE (the head) or h11.SEND_BODY

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        address = self.client[0] if self.client else None
        if address is not None:
            refusal = self.counts.refusal(address)
            if refusal is not None:
                self.transport.write(raw_response(refusal))
                self.transport.close()
                return
            self.counted = address
        self.watch(reading=True)

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop_deadline()
        if self.counted is not None:
            self.counts.release(self.counted)
            self.counted = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self.watch(reading=True)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.watch(reading=bool(self.conn.trailing_data[0]))  # a pipelined head already started

    def watch(self, reading: bool) -> None:
        """Arm the deadline for what the client owes now; ``reading``: bytes of a new head have arrived."""
        state = self.conn.their_state
        if self.transport.is_closing():
            self.stop_deadline()
        elif state is h11.SEND_BODY:
            self.arm(h11.SEND_BODY, self.body_timeout_s)
        elif state is h11.IDLE and reading:
            self.arm(h11.IDLE, self.header_timeout_s)
        else:  # the request is read (the app runs) or the connection idles under uvicorn's keep-alive timer
            self.stop_deadline()

    def arm(self, awaiting: object, seconds: float) -> None:
        if self.awaiting is not awaiting:  # measured from the start of the wait, not from each byte
            self.stop_deadline()
            self.awaiting = awaiting
            self.deadline = self.loop.call_later(seconds, self.expire)

    def stop_deadline(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
        self.deadline = self.awaiting = None

    def expire(self) -> None:
        awaiting, self.deadline, self.awaiting = self.awaiting, None, None
        if self.transport.is_closing():
            return
        if awaiting is h11.SEND_BODY and self.cycle is not None and not self.cycle.response_started:
            message = f"the request body did not arrive within {self.body_timeout_s:g} s"
            self.cycle.disconnected = True  # the app's own answer, if it tries one, is dropped
            self.transport.write(raw_response(ApiError(408, message, "body_timeout")))
        elif awaiting is h11.IDLE and self.conn.trailing_data[0]:
            message = f"the request head did not arrive within {self.header_timeout_s:g} s"
            self.transport.write(raw_response(ApiError(408, message, "header_timeout")))
        self.transport.close()


def guarded_protocol(config: ServerConfig) -> type[H11Protocol]:
    """A protocol class for one server (uvicorn.Config's ``http``), its per-address counts shared."""

    class ServerProtocol(GuardedH11Protocol):
        counts = ClientCounts(config.max_connections_per_client, config.max_connections)
        header_timeout_s = config.header_timeout_s
        body_timeout_s = config.body_timeout_s

    return ServerProtocol
