"""What other threads ask of the engine's worker, and the queue that carries it.

Each command is a frozen dataclass; the worker handles them in order between steps. A
caller that waits for the outcome posts a ``Future`` with it (the result, or the exception
the handler raised).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from multilora_studio.engine.batch.sequence import Sequence
from multilora_studio.engine.loop.requests import RequestStream


@dataclass(frozen=True)
class AddRequests:
    """Queue requests together (they reach the scheduler in the same step)."""

    requests: list[tuple[Sequence, RequestStream]]


@dataclass(frozen=True)
class AbortRequest:
    request_id: str


@dataclass(frozen=True)
class RemoveAdapter:
    name: str


@dataclass(frozen=True)
class PinAdapter:
    name: str
    pinned: bool


@dataclass(frozen=True)
class SnapshotMetrics:
    """Publish a metrics snapshot of this moment and return it."""


@dataclass(frozen=True)
class CallOnWorker:
    """Run ``work`` on the worker thread and return its result (diagnostics)."""

    work: Callable[[], Any]


@dataclass(frozen=True)
class Park:
    """Swap the base out: weights and slots to host memory, KV cache and graphs freed."""


@dataclass(frozen=True)
class Unpark:
    """Swap the base back in."""


@dataclass(frozen=True)
class Shutdown:
    """Finish every request with reason 'abort' and end the worker loop."""


Command = (
    AddRequests
    | AbortRequest
    | RemoveAdapter
    | PinAdapter
    | SnapshotMetrics
    | CallOnWorker
    | Park
    | Unpark
    | Shutdown
)


class CommandQueue:
    """Commands from any thread to the worker; ``wake`` is set whenever one arrives."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Command, Future | None]] = queue.SimpleQueue()
        self.wake = threading.Event()  # also set by adapter loads that finish

    def post(self, command: Command, future: Future | None = None) -> None:
        self._queue.put((command, future))
        self.wake.set()

    def take(self) -> tuple[Command, Future | None] | None:
        """The oldest command and its future, or None when the queue is empty."""
        try:
            return self._queue.get_nowait()
        except queue.Empty:
            return None
