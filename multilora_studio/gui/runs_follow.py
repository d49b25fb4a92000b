"""The window's follower of training runs: a poll every few seconds on a background task, never on
the GUI thread (a folder's scan, an import, an evaluation take seconds on a slow disk).

Each poll leases the first base (the runs' checkpoints are its adapters), serves what arrived on
it and moves the aliases in the server's table (``BasePool.aliases``), so a running server answers
``RUN@latest`` with the checkpoint that just arrived. The runs the library was following are
resumed when the engine is ready; while it is not, nothing is polled.
"""

from __future__ import annotations

import logging
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal

from multilora_studio.adapters.base_model import BaseModelRef
from multilora_studio.gui.engine_host import EngineHost
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
        self.timer = QTimer(self)
        self.timer.setInterval(interval_ms)
        self.timer.timeout.connect(self.poll)
        self.host.ready.connect(self._engine_ready)
        self.timer.start()

    @property
    def busy(self) -> bool:
        return self.task is not None

    def watch(self, name: str, folder: Path, prompt_set: Path | None) -> Task:
        """Follow a new run (or resume one) on a background task; a bad prompt set fails it."""
        follower = self._follower()

        def work(task: Task) -> str:
            follower.follow(name, folder, prompt_set)
            return name

        return self.host.tasks.run(f"watch {name}", work, lambda _: self.poll(), self.failed.emit)

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

        self.task = self.host.tasks.run("poll runs", work, self._polled, self.failed.emit, on_done=self._done)

    def _polled(self, updates: list[RunUpdate]) -> None:
        if any(update.polled.imported for update in updates):
            self.host.reload_adapters()  # the new checkpoints are listed in Compare and the Library
        self.polled.emit(updates)

    def _done(self) -> None:
        self.task = None

    def _follower(self) -> RunFollower:
        if self.follower is None:
            engine = self.host.engine
            if engine is None:
                raise RuntimeError("the engine is not running; runs are followed once it is")
            self.follower = RunFollower(self.host.registry, BaseModelRef.of_engine(engine), engine=engine)
        return self.follower

    def _engine_ready(self) -> None:
        """A new engine: a new follower on its base, resuming (on a task: it reads the runs' prompt
        sets) the runs the library follows."""
        self.follower = None
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
