"""One compare run: every column's request submitted at once (one batch per base model), each
stream read on its own thread.

Each column sends its own prompt (a chat column its own history) with its own settings to its
own base's engine: the columns of one base go in one ``submit_many``, base after base, each
under a lease of its base (``BasePool.acquire``: a swapped-out base loads first, while the
bases already submitted run), released when its last column ends.

Reader threads never touch widgets: they buffer text and emit ``updated(column)``
once per batch of buffered text; the view drains the buffer with ``take``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QObject, Signal

from multilora_studio.deploy import BasePool, BaseUnavailable
from multilora_studio.engine import (
    EngineStopped,
    Prompt,
    RequestOutput,
    RequestStream,
    SamplingParams,
    ServingEngine,
)
from multilora_studio.gui.tasks import user_message
from multilora_studio.gui.workflows.compare_requests import ColumnRequest, ColumnUpdate, prompt_counts
from multilora_studio.run_records import EngineRecord

log = logging.getLogger(__name__)


@dataclass
class _Column:
    name: str
    base: str
    adapter: str | None
    prompt: Prompt
    params: SamplingParams
    pending: list[str] = field(default_factory=list)
    tokens: int = 0
    first_token: float | None = None
    last_token: float | None = None
    notified: bool = False
    output: RequestOutput | None = None
    live: RequestOutput | None = None  # its stream's output while it runs (the engine fills it in)
    request_id: str | None = None
    engine: ServingEngine | None = None  # its base's, once submitted


class CompareRun(QObject):
    """Runs each column's request ('base' = no adapter) in one batched run of its base's engine."""

    updated = Signal(int)
    columnFinished = Signal(int)
    finished = Signal()
    failed = Signal(str)

    def __init__(
        self, pool: BasePool, requests: list[ColumnRequest], side_work: Callable[[], Any] | None = None
    ) -> None:
        """``side_work`` runs on the launch thread once the requests are queued; ``finished`` comes
        when it has ended too, and its result is ``side_result`` (slow bookkeeping the GUI thread
        must not do)."""
        super().__init__()
        self.pool = pool
        self.requests = list(requests)
        self.side_result: Any = None
        self._side_work = side_work
        self._side_done = False
        self._finish_sent = False
        self.columns = [_Column(r.name, r.base, r.adapter, r.prompt, r.engine_params) for r in requests]
        self._lock = threading.Lock()
        self._stopped = False
        self._remaining = len(requests)
        self._leased: dict[str, int] = {}  # base -> its columns still reading under its lease
        self.engine_records: dict[str, EngineRecord] = {}  # base -> the engine its columns ran on
        self.started_at = 0.0

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def start(self) -> None:
        self.started_at = time.monotonic()
        threading.Thread(target=self._launch, name="compare-launch", daemon=True).start()

    @property
    def bases(self) -> list[str]:
        """The run's bases, in the order their columns are submitted."""
        return list(dict.fromkeys(c.base for c in self.columns))

    def stop(self) -> None:
        """Abort every request of the run; each column finishes with reason 'abort'."""
        with self._lock:
            self._stopped = True
            running = [(c.engine, c.request_id) for c in self.columns if c.request_id and c.output is None]
        self._abort(running)

    @staticmethod
    def _abort(running: Sequence[tuple[ServingEngine | None, str | None]]) -> None:
        for engine, request_id in running:
            if engine is None or request_id is None:
                continue
            try:
                engine.abort(request_id)
            except EngineStopped:  # its requests ended already
                continue

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
            counted = output or column.live
            prompt, cached = prompt_counts(counted) if counted is not None else (None, None)
            done = output is not None
            return ColumnUpdate(text, column.tokens, ttft, queue, rate, done, output, prompt, cached)

    # ---------------------------------------------------------------- worker threads

    def _launch(self) -> None:
        submitted = False
        for base in self.bases:
            indices = [i for i, c in enumerate(self.columns) if c.base == base]
            try:
                submitted = self._submit(base, indices) or submitted
            except Exception as error:  # nothing of the run queued yet: the run failed
                if not submitted:
                    self.failed.emit(user_message(error))
                    return
                for index in indices:  # other bases' columns already run: this base's fail
                    self._close(index, self._error_output(index, user_message(error)))
        try:
            self.side_result = self._side_work() if self._side_work is not None else None
        except Exception:
            log.exception("compare bookkeeping failed")
        finally:
            self._side_work = None
            with self._lock:
                self._side_done = True
            self._finish_when_done()

    def _submit(self, base: str, indices: list[int]) -> bool:
        """Queue the columns of ``base`` in one submission (every one reaches the same step, or
        none is queued) under a lease of the base; False when the run was stopped first."""
        with self._lock:
            stopped = self._stopped
        if stopped:
            for index in indices:
                self._close(index, None)
            return False
        try:
            engine = self.pool.acquire(base)  # a swapped-out base loads here
        except BaseUnavailable as error:  # stopped meanwhile (a restart): its columns are aborted
            with self._lock:
                stopped = self._stopped
            for index in indices:
                self._close(index, None if stopped else self._error_output(index, str(error)))
            return False
        try:
            self.engine_records[base] = EngineRecord.of(engine)
            columns = [self.columns[i] for i in indices]
            streams = engine.submit_many([(c.prompt, c.adapter, c.params) for c in columns])
        except BaseException:
            self.pool.release(base)
            raise
        with self._lock:
            self._leased[base] = len(indices)
            for column, stream in zip(columns, streams, strict=True):
                column.request_id, column.engine, column.live = stream.request_id, engine, stream.output
            stopped = self._stopped
        if stopped:
            self._abort([(engine, stream.request_id) for stream in streams])
        for index, stream in zip(indices, streams, strict=True):
            threading.Thread(
                target=self._read, args=(index, stream), name=f"compare-read-{index}", daemon=True
            ).start()
        return True

    def _error_output(self, index: int, message: str) -> RequestOutput:
        return RequestOutput("", self.columns[index].adapter, [], finish_reason="error", error=message)

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
            release = column.engine is not None
            if release:
                self._leased[column.base] -= 1
                release = self._leased[column.base] == 0
        if release:
            self.pool.release(column.base)
        self.columnFinished.emit(index)
        if last:
            self._finish_when_done()

    def _finish_when_done(self) -> None:
        """Emit ``finished`` once, when every column has ended and the side work too (whichever
        comes last: a column can end on the launch thread itself, before its side work runs)."""
        with self._lock:
            due = self._remaining == 0 and self._side_done and not self._finish_sent
            self._finish_sent = self._finish_sent or due
        if due:
            self.finished.emit()
