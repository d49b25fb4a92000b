"""A submitted request as seen by its caller: a stream of deltas and a final output.

The engine's worker thread pushes into it; any thread may iterate it, and an
asyncio task may ``async for`` over it (deltas arrive through the task's loop).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator

from multilora_studio.engine.outputs import RequestOutput, TokenDelta


class RequestStream:
    """Deltas of one request, in order; the last has ``finished=True``."""

    def __init__(self, output: RequestOutput, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.output = output
        self._loop = loop
        self._queue: queue.Queue[TokenDelta] = queue.Queue()
        self._async_queue: asyncio.Queue[TokenDelta] | None = asyncio.Queue() if loop else None
        self._lock = threading.Lock()  # guards the two below (the worker and any thread)
        self._finished = False
        self._done_callbacks: list[Callable[[], None]] = []

    @property
    def request_id(self) -> str:
        return self.output.request_id

    def push(self, delta: TokenDelta) -> None:
        """Called by the worker thread."""
        if delta.finished:
            with self._lock:
                if self._finished:  # failed already (``fail``): the stream has its last delta
                    return
                self._finished = True
                callbacks, self._done_callbacks = self._done_callbacks, []
        self._deliver(delta)
        if delta.finished:
            for callback in callbacks:
                callback()

    def _deliver(self, delta: TokenDelta) -> None:
        if self._loop is not None and self._async_queue is not None:
            try:
                self._loop.call_soon_threadsafe(self._async_queue.put_nowait, delta)
            except RuntimeError:  # the caller's loop is closed: nobody is listening any more
                return
        else:
            self._queue.put(delta)

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on the thread that finishes the stream) once its last delta is
        pushed; at once when it already was."""
        with self._lock:
            if not self._finished:
                self._done_callbacks.append(callback)
                return
        callback()

    def fail(self, error: str) -> None:
        """Finish the stream with reason 'error' unless it has finished: for a request whose
        engine can no longer finish it (its worker thread died)."""
        if self.finished:
            return
        self.output.finish_reason, self.output.error = "error", error
        self.output.finish_time = time.monotonic()
        self.push(TokenDelta(self.request_id, [], "", True, "error", error))

    @property
    def finished(self) -> bool:
        with self._lock:
            return self._finished

    def __iter__(self) -> Iterator[TokenDelta]:
        if self._async_queue is not None:
            raise TypeError("this stream was opened for asyncio; use 'async for'")
        while True:
            delta = self._queue.get()
            yield delta
            if delta.finished:
                return

    async def __aiter__(self) -> AsyncIterator[TokenDelta]:
        if self._async_queue is None:
            raise TypeError("this stream was opened for threads; iterate it with 'for'")
        while True:
            delta = await self._async_queue.get()
            yield delta
            if delta.finished:
                return

    def result(self, timeout: float | None = None) -> RequestOutput:
        """Wait for the request to finish and return its output (thread streams only)."""
        for delta in self._iter_with_timeout(timeout):
            if delta.finished:
                break
        return self.output

    def _iter_with_timeout(self, timeout: float | None) -> Iterator[TokenDelta]:
        while True:
            try:
                delta = self._queue.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"request {self.request_id} did not finish in {timeout} s") from None
            yield delta
            if delta.finished:
                return
