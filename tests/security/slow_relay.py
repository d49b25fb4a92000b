"""A slow network in front of a real server: a TCP relay that holds each new connection a while
before it passes bytes on (the server behind it answers as it always does)."""

from __future__ import annotations

import contextlib
import socket
import threading


class SlowRelay:
    """Relays ``127.0.0.1:<port>`` to ``target_port`` after holding each connection ``hold_s``."""

    def __init__(self, target_port: int, hold_s: float) -> None:
        self.target_port = target_port
        self.hold_s = hold_s
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self.connections = 0  # accepted so far
        threading.Thread(target=self._accept, name="slow-relay", daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        with self._lock:
            self._sockets.append(client)
        if self._stop.wait(self.hold_s):
            return
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
        except OSError:
            client.close()
            return
        with self._lock:
            self._sockets.append(upstream)
        threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()
        self._pipe(client, upstream)

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()
