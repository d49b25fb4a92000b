"""A submitted request as seen by its caller: a stream of deltas and a final output.

The engine's worker thread pushes into it; any thread may iterate it, and an
asyncio task may ``async for`` over it (deltas arrive through the task's loop).
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator, Iterator

from multilora_studio.engine.outputs import RequestOutput, TokenDelta


class RequestStream:
    """Deltas of one request, in order; the last has ``finished=True``."""

    def __init__(self, output: RequestOutput, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.output = output
        self._loop = loop
        self._queue: queue.Queue[TokenDelta] = queue.Queue()
        self._async_queue: asyncio.Queue[TokenDelta] | None = asyncio.Queue() if loop else None

    @property
    def request_id(self) -> str:
        return self.output.request_id

    def push(self, delta: TokenDelta) -> None:
        """Called by the worker thread."""
        if self._loop is not None and self._async_queue is not None:
            try:
                self._loop.call_soon_threadsafe(self._async_queue.put_nowait, delta)
            except RuntimeError:  # the caller's loop is closed: nobody is listening any more
                return
        else:
            self._queue.put(delta)

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
