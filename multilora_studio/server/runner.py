"""Run the endpoint in-process: uvicorn on its own thread and event loop, started and stopped at will.

The engine keeps running across start/stop (the GUI's toggle); stop aborts the
requests in flight, closes every connection and frees the port.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import threading
import time

import uvicorn

from multilora_studio.adapters.registry import Registry
from multilora_studio.deploy import BasePool
from multilora_studio.engine import ServingEngine
from multilora_studio.server.app import create_app
from multilora_studio.server.config import ServerConfig
from multilora_studio.server.connection_guard import guarded_protocol
from multilora_studio.server.hub_resolver import HubResolver
from multilora_studio.server.limits import Admission
from multilora_studio.server.metrics import ServerMetrics
from multilora_studio.server.request_log import RequestLog
from multilora_studio.server.state import ServerState
from multilora_studio.server.usage import UsageLedger

log = logging.getLogger(__name__)


class PortInUseError(RuntimeError):
    """The address is taken by another process (or another server of ours)."""


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``; a taken port raises PortInUseError with a clear message."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as error:
        raise ValueError(f"cannot resolve host {host!r}: {error}") from None
    sock = socket.socket(family, kind, proto)
    try:
        if os.name == "nt":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_EXCLUSIVEADDRUSE, 1)  # type: ignore[attr-defined]
        else:
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_REUSEADDR, 1
            )  # rebind over TIME_WAIT, not a listener
        sock.bind(address)
        sock.listen(1024)
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            raise PortInUseError(
                f"{host}:{port} is already in use (is another server running?); "
                "choose another port with --port"
            ) from None
        raise RuntimeError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    return sock


def build_server_state(
    pool: BasePool,
    config: ServerConfig,
    request_log: RequestLog | None = None,
    registry: Registry | None = None,
    usage: UsageLedger | None = None,
) -> ServerState:
    """What the routes share for ``pool`` under ``config``: limits, metrics, the request log, the
    usage ledger, and the Hub resolver when Hub adapters are allowed (pulled into ``registry``,
    default the user's). A ``request_log`` and ``usage`` given outlive this server (the window's)."""
    admission = Admission(
        config.max_in_flight, config.max_concurrent_per_key, config.tokens_per_minute_per_key
    )
    usage = usage or UsageLedger()
    state = ServerState(
        pool,
        config,
        admission,
        ServerMetrics(pool, usage),
        request_log or RequestLog(config.request_log_size),
        usage,
        int(time.time()),
    )
    if config.allow_hub_adapters:
        state.hub = HubResolver(
            pool,
            registry or Registry(),
            config.hub_pull_timeout_s,
            config.hub_pulls_at_once,
            config.hub_pull_limit,
            config.hub_pull_max_bytes,
        )
    return state


class ApiServer:
    """The OpenAI-compatible endpoint over one engine (or replica set) or a pool of base models;
    ``start()``/``stop()`` from any thread."""

    def __init__(
        self,
        engines: ServingEngine | BasePool,
        config: ServerConfig | None = None,
        request_log: RequestLog | None = None,
        registry: Registry | None = None,
        usage: UsageLedger | None = None,
    ):
        """``engines``: one engine (served as a pool of one base that is never swapped; it is
        the caller's to shut down), or a pool. ``registry``: the library Hub adapters are pulled
        into (default: the user's)."""
        self.pool = (
            engines if isinstance(engines, BasePool) else BasePool([engines.config], started=[engines])
        )
        self.config = config or ServerConfig()
        self.state = build_server_state(self.pool, self.config, request_log, registry, usage)
        self.request_log, self.metrics, self.usage = (
            self.state.request_log,
            self.state.metrics,
            self.state.usage,
        )
        self.app = create_app(self.config, self.state)
        self._lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._failure: BaseException | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def url(self) -> str:
        """``http://host:port`` of the running server (the bound port when ``port=0``)."""
        if self._sock is None:
            raise RuntimeError("the server is not running")
        host, port = self._sock.getsockname()[:2]
        host = self.config.host if self.config.host not in ("0.0.0.0", "::") else host
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def start(self, sock: socket.socket | None = None, timeout: float = 15.0) -> str:
        """Bind (or take ``sock``), serve on a new thread, return the URL once it accepts connections."""
        with self._lock:
            if self.running:
                return self.url
            sock = sock or bind_socket(self.config.host, self.config.port)
            config = uvicorn.Config(
                self.app,
                http=guarded_protocol(self.config),
                lifespan="off",
                log_config=None,
                log_level="warning",
                access_log=False,
                server_header=False,
                timeout_graceful_shutdown=self.config.graceful_shutdown_s,
                timeout_keep_alive=5,
            )
            server = uvicorn.Server(config)
            self._failure = None
            thread = threading.Thread(target=self._serve, args=(server, sock), name="api-server", daemon=True)
            self._server, self._sock, self._thread = server, sock, thread
            thread.start()
            deadline = time.monotonic() + timeout
            while not server.started and thread.is_alive() and time.monotonic() < deadline:
                time.sleep(0.01)
            if not server.started:
                self._halt(timeout)
                raise RuntimeError(f"the API server did not start: {self._failure or 'timed out'}")
            log.info("API server listening on %s", self.url)
            return self.url

    def _serve(self, server: uvicorn.Server, sock: socket.socket) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            await server.serve(sockets=[sock])

        try:
            asyncio.run(main())
        except BaseException as error:  # uvicorn exits with SystemExit when startup fails
            self._failure = error
            log.exception("API server stopped with an error")

    def stop(self, timeout: float = 15.0) -> None:
        """Abort requests in flight, close connections and free the port; the engine keeps running."""
        with self._lock:
            self._halt(timeout)

    def _halt(self, timeout: float) -> None:
        server, thread, loop = self._server, self._thread, self._loop
        if server is not None and thread is not None:
            if loop is not None and thread.is_alive():
                with contextlib.suppress(RuntimeError):  # the loop already closed
                    loop.call_soon_threadsafe(self.state.abort_all)
            if self.state.hub is not None:
                self.state.hub.close()
            server.should_exit = True
            thread.join(timeout)
            if thread.is_alive():
                server.force_exit = True
                thread.join(timeout)
        if self._sock is not None:
            self._sock.close()
        self._server = self._thread = self._sock = self._loop = None
        if server is not None:
            log.info("API server stopped")

    def __enter__(self) -> ApiServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
