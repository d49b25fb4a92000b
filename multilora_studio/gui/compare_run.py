"""One compare run: every column's request submitted at once (one batch), each stream read on its own thread.

Each column sends its own prompt (a chat column its own history) with its own settings.

Reader threads never touch widgets: they buffer text and emit ``updated(column)``
once per batch of buffered text; the view drains the buffer with ``take``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from PySide6.QtCore import QObject, Signal

from multilora_studio.engine import (
    Prompt,
    RequestOutput,
    RequestStream,
    SamplingParams,
    ServingEngine,
)
from multilora_studio.gui.tasks import user_message
from multilora_studio.run_records import column_choice

log = logging.getLogger(__name__)


@dataclass
class ColumnUpdate:
    """What a column gained since the last ``take``, and its running numbers."""

    text: str
    tokens: int
    ttft_s: float | None
    queue_s: float | None  # the wait before its first step (part of the TTFT)
    tokens_per_second: float | None
    done: bool
    output: RequestOutput | None


@dataclass(frozen=True)
class ColumnRequest:
    """What one column sends: 'base', an adapter or an adapter at a strength (``column_choice``),
    its prompt and its settings."""

    name: str
    prompt: Prompt
    params: SamplingParams

    @property
    def adapter(self) -> str | None:
        return column_choice(self.name)[0]

    @property
    def engine_params(self) -> SamplingParams:
        """``params`` with the column's adapter strength."""
        scale = column_choice(self.name)[1]
        return self.params if scale == 1.0 else replace(self.params, adapter_scale=scale)


@dataclass
class _Column:
    name: str
    adapter: str | None
    prompt: Prompt
    params: SamplingParams
    pending: list[str] = field(default_factory=list)
    tokens: int = 0
    first_token: float | None = None
    last_token: float | None = None
    notified: bool = False
    output: RequestOutput | None = None
    request_id: str | None = None


class CompareRun(QObject):
    """Runs each column's request ('base' = no adapter) in one batched engine run."""

    updated = Signal(int)
    columnFinished = Signal(int)
    finished = Signal()
    failed = Signal(str)

    def __init__(
        self, engine: ServingEngine, requests: list[ColumnRequest], side_work: Callable[[], Any] | None = None
    ) -> None:
        """``side_work`` runs on the launch thread once the requests are queued; ``finished`` waits for it
        and its result is ``side_result`` (slow bookkeeping the GUI thread must not do)."""
        super().__init__()
        self.engine = engine
        self.requests = list(requests)
        self.side_result: Any = None
        self._side_work = side_work
        self._side_done = threading.Event()
        self.columns = [_Column(r.name, r.adapter, r.prompt, r.engine_params) for r in requests]
        self._lock = threading.Lock()
        self._stopped = False
        self._remaining = len(requests)
        self.started_at = 0.0

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def start(self) -> None:
        self.started_at = time.monotonic()
        threading.Thread(target=self._launch, name="compare-launch", daemon=True).start()

    def stop(self) -> None:
        """Abort every request of the run; each column finishes with reason 'abort'."""
        with self._lock:
            self._stopped = True
            ids = [c.request_id for c in self.columns if c.request_id and c.output is None]
        self._abort(ids)

    def _abort(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            try:
                self.engine.abort(request_id)
            except RuntimeError:  # the engine was shut down: its requests ended already
                return

    def take(self, index: int) -> ColumnUpdate:
        """Drain column ``index``'s buffered text (GUI thread)."""
        with self._lock:
            column = self.columns[index]
            text = "".join(column.pending)
            column.pending.clear()
            column.notified = False
            rate = None
            if column.first_token is not None and column.last_token is not None and column.tokens > 1:
                span = column.last_token - column.first_token
                rate = (column.tokens - 1) / span if span > 0 else None
            ttft = None if column.first_token is None else column.first_token - self.started_at
            output = column.output
            queue = None
            if output is not None:
                ttft = output.ttft if output.ttft is not None else ttft
                rate = output.tokens_per_second if output.tokens_per_second is not None else rate
                queue = output.queue_time
            return ColumnUpdate(text, column.tokens, ttft, queue, rate, output is not None, output)

    # ---------------------------------------------------------------- worker threads

    def _launch(self) -> None:
        with self._lock:
            stopped = self._stopped
        if stopped:
            self._side_done.set()
            for index in range(len(self.columns)):
                self._close(index, None)
            return
        try:  # one submission: every column reaches the same step, or none is queued
            streams = self.engine.submit_many([(c.prompt, c.adapter, c.params) for c in self.columns])
        except Exception as error:
            self._side_done.set()
            self.failed.emit(user_message(error))
            return
        with self._lock:
            for column, stream in zip(self.columns, streams, strict=True):
                column.request_id = stream.request_id
            stopped = self._stopped
        if stopped:
            self._abort([stream.request_id for stream in streams])
        for index, stream in enumerate(streams):
            threading.Thread(
                target=self._read, args=(index, stream), name=f"compare-read-{index}", daemon=True
            ).start()
        try:
            self.side_result = self._side_work() if self._side_work is not None else None
        except Exception:
            log.exception("compare bookkeeping failed")
        finally:
            self._side_work = None
            self._side_done.set()

    def _read(self, index: int, stream: RequestStream) -> None:
        column = self.columns[index]
        for delta in stream:
            now = time.monotonic()
            with self._lock:
                if delta.token_ids:
                    column.tokens += len(delta.token_ids)
                    column.first_token = column.first_token or now
                    column.last_token = now
                if delta.text:
                    column.pending.append(delta.text)
                notify = not column.notified and bool(column.pending)
                column.notified = column.notified or notify
            if notify:
                self.updated.emit(index)
        self._close(index, stream.output)

    def _close(self, index: int, output: RequestOutput | None) -> None:
        with self._lock:
            column = self.columns[index]
            column.output = output or RequestOutput("", column.adapter, [], finish_reason="abort")
            self._remaining -= 1
            last = self._remaining == 0
        self.columnFinished.emit(index)
        if last:
            self._side_done.wait()
            self.finished.emit()
