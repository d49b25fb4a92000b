"""One compare run: every column's request submitted at once (one batch), each stream read on its own thread.

Reader threads never touch widgets: they buffer text and emit ``updated(column)``
once per batch of buffered text; the view drains the buffer with ``take``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, Signal

from multilora_studio.engine import Engine, Prompt, RequestOutput, RequestStream, SamplingParams
from multilora_studio.gui.tasks import user_message

log = logging.getLogger(__name__)

BASE = "base"


@dataclass
class ColumnUpdate:
    """What a column gained since the last ``take``, and its running numbers."""

    text: str
    tokens: int
    ttft_s: float | None
    tokens_per_second: float | None
    done: bool
    output: RequestOutput | None


@dataclass
class _Column:
    name: str
    adapter: str | None
    pending: list[str] = field(default_factory=list)
    tokens: int = 0
    first_token: float | None = None
    last_token: float | None = None
    notified: bool = False
    output: RequestOutput | None = None
    request_id: str | None = None


class CompareRun(QObject):
    """Runs ``prompt`` through each of ``names`` ('base' = no adapter) in one batched engine run."""

    updated = Signal(int)
    columnFinished = Signal(int)
    finished = Signal()
    failed = Signal(str)

    def __init__(self, engine: Engine, prompt: Prompt, names: list[str], params: SamplingParams) -> None:
        super().__init__()
        self.engine = engine
        self.prompt = prompt
        self.params = params
        self.columns = [_Column(name, None if name == BASE else name) for name in names]
        self._lock = threading.Lock()
        self._stopped = False
        self._remaining = len(names)
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
        for request_id in ids:
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
            if output is not None:
                ttft = output.ttft if output.ttft is not None else ttft
                rate = output.tokens_per_second if output.tokens_per_second is not None else rate
            return ColumnUpdate(text, column.tokens, ttft, rate, output is not None, output)

    # ---------------------------------------------------------------- worker threads

    def _launch(self) -> None:
        streams: list[RequestStream] = []
        try:
            for column in self.columns:
                with self._lock:
                    if self._stopped:
                        break
                stream = self.engine.submit(self.prompt, column.adapter, self.params)
                with self._lock:
                    column.request_id = stream.request_id
                streams.append(stream)
        except Exception as error:
            for stream in streams:
                try:
                    self.engine.abort(stream.request_id)
                except RuntimeError:
                    break
            self.failed.emit(user_message(error))
            return
        with self._lock:
            stopped = self._stopped
        if stopped:
            for stream in streams:
                self.engine.abort(stream.request_id)
        for index in range(len(streams), len(self.columns)):  # stopped before submitting these
            self._close(index, None)
        for index, stream in enumerate(streams):
            threading.Thread(
                target=self._read, args=(index, stream), name=f"compare-read-{index}", daemon=True
            ).start()

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
            self.finished.emit()
