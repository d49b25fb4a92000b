"""Starts and stops the in-process OpenAI-compatible server off the GUI thread; relays its request
log and keeps its usage ledger (both outlive each server, so a restart keeps the counts)."""

from __future__ import annotations

import logging

from PySide6.QtCore import QObject, Signal

from multilora_studio.deploy import BasePool
from multilora_studio.gui.tasks import Task, TaskRunner
from multilora_studio.server import ApiServer, RequestLog, ServerConfig
from multilora_studio.server.usage import UsageLedger

log = logging.getLogger(__name__)

OFF, STARTING, ON, STOPPING = "off", "starting", "on", "stopping"


class ServerControl(QObject):
    """One endpoint at a time; ``requestLogged`` carries each RequestRecord to the GUI thread."""

    stateChanged = Signal(str)
    failed = Signal(str)
    requestLogged = Signal(object)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.tasks = TaskRunner(self)
        self.request_log = RequestLog()
        self.usage = UsageLedger()
        self._unsubscribe = self.request_log.subscribe(self.requestLogged.emit)
        self.server: ApiServer | None = None
        self.state = OFF
        self.url = ""
        self.config: ServerConfig | None = None

    def start(self, pool: BasePool, config: ServerConfig) -> Task | None:
        """Serve every base of ``pool`` and their adapters (each request on its own base)."""
        if self.state != OFF:
            return None
        self._set_state(STARTING)
        self.config = config
        server = ApiServer(pool, config, request_log=self.request_log, usage=self.usage)

        def started(url: str) -> None:
            self.server, self.url = server, url
            self._set_state(ON)

        def failed(message: str) -> None:
            self._set_state(OFF)
            self.failed.emit(message)

        return self.tasks.run("server-start", lambda task: server.start(), started, failed)

    def stop(self) -> Task | None:
        server = self.server
        if server is None or self.state != ON:
            return None
        self._set_state(STOPPING)

        def stopped(_: object = None) -> None:
            self.server, self.url = None, ""
            self._set_state(OFF)

        return self.tasks.run("server-stop", lambda task: server.stop(), stopped, lambda m: stopped())

    def shutdown(self) -> None:
        """Stop now, blocking (window close)."""
        if self.server is not None:
            self.server.stop()
        self.server, self.url = None, ""
        self._unsubscribe()
        self._set_state(OFF)

    def _set_state(self, state: str) -> None:
        self.state = state
        self.stateChanged.emit(state)
