"""Run slow work off the GUI thread and report back through queued signals."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, Signal

from multilora_studio.gui.field_labels import in_field_labels

log = logging.getLogger(__name__)

USER_ERRORS = (ValueError, RuntimeError, OSError, TimeoutError)


class Cancelled(Exception):
    """The user cancelled the task."""


def user_message(error: BaseException) -> str:
    """A message a person can act on, never a traceback."""
    if isinstance(error, Cancelled):
        return "cancelled"
    if isinstance(error, FileNotFoundError) and error.filename:
        return f"{error.filename} does not exist"
    if isinstance(error, USER_ERRORS) and str(error):
        return in_field_labels(error)
    return f"unexpected error ({type(error).__name__}): {error}"


class Task(QObject):
    """One call of ``work(task)`` on a daemon thread; the signals arrive on the GUI thread.

    ``work`` reports with ``task.report(fraction, message)``, which raises Cancelled once
    ``cancel()`` was called, so the work stops at its next report.
    """

    progressed = Signal(float, str)
    succeeded = Signal(object)
    failed = Signal(str)
    done = Signal()

    def __init__(self, name: str, work: Callable[[Task], Any]) -> None:
        super().__init__()
        self.name = name
        self._work: Callable[[Task], Any] | None = work
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"gui-task-{name}", daemon=True)
        self.callbacks: list[tuple[Any, Callable[..., None]]] = []  # what TaskRunner connected
        self.error_type: type[BaseException] | None = None  # what the work raised, once it failed
        self.delivered = False  # True once ``done`` reached the GUI thread (after the result signals)
        self.done.connect(self._mark_delivered)

    @property
    def cancel_event(self) -> threading.Event:
        return self._cancel

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def start(self) -> Task:
        self._thread.start()
        return self

    def cancel(self) -> None:
        self._cancel.set()

    def report(self, fraction: float, message: str) -> None:
        """Called by the work (any thread); raises Cancelled when the user cancelled."""
        if self._cancel.is_set():
            raise Cancelled
        self.progressed.emit(float(fraction), message)

    def notify(self, fraction: float, message: str) -> None:
        """Like ``report`` but never raises (for work that watches ``cancel_event`` itself)."""
        self.progressed.emit(float(fraction), message)

    def wait(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _mark_delivered(self) -> None:
        self.delivered = True

    def _run(self) -> None:
        work, self._work = self._work, None  # a finished task keeps nothing its work referenced
        assert work is not None, "a task runs once"
        try:
            result = work(self)
        except BaseException as error:
            self.error_type = type(error)
            if not isinstance(error, (Cancelled, *USER_ERRORS)):
                log.exception("task %s failed", self.name)
            else:
                log.info("task %s: %s", self.name, user_message(error))
            self.failed.emit(user_message(error))
        else:
            self.succeeded.emit(result)
            del result
        self.done.emit()


class TaskRunner(QObject):
    """Starts tasks and keeps each alive until it is done.

    Once a task's results reached the GUI thread its callbacks are disconnected, so nothing they
    captured (an engine, a window's state) outlives the task.
    """

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._running: set[Task] = set()

    def run(
        self,
        name: str,
        work: Callable[[Task], Any],
        on_success: Callable[[Any], None] | None = None,
        on_failure: Callable[[str], None] | None = None,
        on_progress: Callable[[float, str], None] | None = None,
        on_done: Callable[[], None] | None = None,
    ) -> Task:
        """Start ``work`` on its own thread. The callbacks are connected before it starts: a
        signal the thread emits before a later ``connect`` would never reach that slot."""
        task = Task(name, work)
        if on_done is not None:
            task.done.connect(on_done)
        for signal, callback in (
            (task.succeeded, on_success),
            (task.failed, on_failure),
            (task.progressed, on_progress),
        ):
            if callback is not None:
                signal.connect(callback)
                task.callbacks.append((signal, callback))
        task.done.connect(self._finished)
        self._running.add(task)
        return task.start()

    def _finished(self) -> None:
        task = self.sender()
        if not isinstance(task, Task):
            return
        self._running.discard(task)
        for signal, callback in task.callbacks:
            signal.disconnect(callback)
        task.callbacks.clear()

    @property
    def busy(self) -> bool:
        return bool(self._running)
