"""The window's follower of training runs: a poll every few seconds on a background task, never on
the GUI thread (a folder's scan, an import, an evaluation take seconds on a slow disk).

Each poll leases the first base (the runs' checkpoints are its adapters), serves what arrived on
it and moves the aliases in the server's table (``BasePool.aliases``), so a running server answers
``RUN@latest`` with the checkpoint that just arrived. The runs the library was following are
resumed when the engine is ready; while it is not, nothing is polled.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal

from multilora_studio.adapters.base_model import BaseModelRef
from multilora_studio.gui.engine_host import READY, EngineHost
from multilora_studio.gui.tasks import Task
from multilora_studio.runs import RunFollower, RunUpdate

log = logging.getLogger(__name__)

POLL_MS = 3000


class RunsFollow(QObject):
    """Polls the followed runs; ``polled(updates)`` after each poll, ``failed(message)`` on an error."""

    polled = Signal(list)
    failed = Signal(str)

    def __init__(self, host: EngineHost, parent: QObject | None = None, interval_ms: int = POLL_MS) -> None:
        super().__init__(parent)
        self.host = host
        self.follower: RunFollower | None = None
        self.task: Task | None = None
        self._told: dict[str, str | None] = {}  # each run's error the banner showed
        self.timer = QTimer(self)
        self.timer.setInterval(interval_ms)
        self.timer.timeout.connect(self.poll)
        self.host.ready.connect(self._engine_ready)
        self.host.stateChanged.connect(self._state_changed)
        self.timer.start()

    def watch(
        self, name: str, folder: Path, prompt_set: Path | None, watching: Callable[[], None] | None = None
    ) -> Task:
        """Follow a new run (or resume one) on a background task, then call ``watching``; a bad
        prompt set fails it. RuntimeError while no engine runs."""
        follower = self._follower()

        def work(task: Task) -> str:
            follower.follow(name, folder, prompt_set)
            return name

        def started(_: str) -> None:
            if watching is not None:
                watching()
            self.poll()

        return self.host.tasks.run(f"watch {name}", work, started, self.failed.emit)

    def stop(self, name: str) -> None:
        """Stop following ``name``; its checkpoints stay in the library."""
        if self.follower is not None:
            self.follower.stop(name)
        else:
            self.host.registry.stop_watching(name)

    def poll(self) -> None:
        """Start one poll of every run unless one runs or the engine is not ready."""
        if self.task is not None or self.host.pool is None or self.follower is None or not self.follower.runs:
            return
        follower, host = self.follower, self.host

        def work(task: Task) -> list[RunUpdate]:
            with host.lease() as engine:
                follower.engine = engine
                follower.aliases = host.pool.aliases if host.pool is not None else None
                return follower.poll()

        def polled(updates: list[RunUpdate]) -> None:
            self._polled(follower, updates)

        self.task = self.host.tasks.run("poll runs", work, polled, self._poll_failed, on_done=self._done)

    def _polled(self, follower: RunFollower, updates: list[RunUpdate]) -> None:
        if any(update.polled.imported for update in updates):
            self.host.reload_adapters()  # the new checkpoints are listed in Compare and the Library
        if follower is self.follower:  # a poll of the engine before a restart: its errors are past
            for update in updates:
                if update.error is not None and update.error != self._told.get(update.run):
                    self.failed.emit(f"{update.run}: checkpoints not scored: {update.error}")
                self._told[update.run] = update.error
        self.polled.emit(updates)

    def _poll_failed(self, message: str) -> None:
        """A poll that failed while the engine restarted is no news (the next engine resumes)."""
        if self.host.state != READY:
            log.info("a poll of the training runs ended by the engine's restart: %s", message)
            return
        self.failed.emit(message)

    def _done(self) -> None:
        self.task = None

    def _follower(self) -> RunFollower:
        if self.follower is None:
            engine = self.host.engine
            if engine is None:
                raise RuntimeError("the engine is not running; runs are followed once it is")
            self.follower = RunFollower(self.host.registry, BaseModelRef.of_engine(engine), engine=engine)
        return self.follower

    def _state_changed(self, state: str) -> None:
        """The follower goes with its engine: what a poll of a stopping engine reports is past."""
        if state != READY:
            self.follower = None

    def _engine_ready(self) -> None:
        """A new engine: a new follower on its base, resuming (on a task: it reads the runs' prompt
        sets) the runs the library follows."""
        self.follower = None
        self._told = {}
        try:
            follower = self._follower()
        except RuntimeError as error:
            self.failed.emit(f"training runs not resumed: {error}")
            return

        def resumed(names: list[str]) -> None:
            if names:
                log.info("following the training runs %s again", ", ".join(names))
            self.poll()

        self.host.tasks.run("resume runs", lambda task: follower.resume(), resumed, self.failed.emit)
