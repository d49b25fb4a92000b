"""``/health`` polled while a request stalls: the slowest answer the server gave meanwhile."""

from __future__ import annotations

import threading
import time

from tests.server.raw_http import connect

POLL_S = 0.02
HEALTHY_S = 1.0  # /health answers within this while any one request stalls


class HealthWatch:
    """``with HealthWatch(url) as watch:`` polls ``/health`` on its own connection until the block
    ends; ``watch.slowest`` is the longest answer (seconds), ``watch.answers`` how many came."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.slowest = 0.0
        self.answers = 0
        self.failure: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="health-watch", daemon=True)

    def _poll(self) -> None:
        conn = connect(self.url, timeout=60)
        try:
            while not self._stop.is_set():
                started = time.perf_counter()
                conn.request("GET", "/health")
                response = conn.getresponse()
                response.read()
                self.slowest = max(self.slowest, time.perf_counter() - started)
                if response.status != 200:
                    self.failure = f"/health answered {response.status}"
                self.answers += 1
                self._stop.wait(POLL_S)
        except OSError as error:
            self.failure = f"/health failed: {error}"
        finally:
            conn.close()

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(120)

    def check(self) -> None:
        """AssertionError unless every poll answered 200 within ``HEALTHY_S``."""
        assert self.failure is None, self.failure
        assert self.answers >= 1, "/health never answered during the request"
        assert self.slowest < HEALTHY_S, f"/health took {self.slowest:.2f} s during the request"
