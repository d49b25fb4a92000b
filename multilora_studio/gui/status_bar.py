"""The status bar: engine state (with load progress and Cancel), device, base model, memory, endpoint URL."""

from __future__ import annotations

import psutil
from PySide6.QtWidgets import QFrame, QLabel, QProgressBar, QStatusBar, QToolButton, QWidget

from multilora_studio.engine import EngineMetrics
from multilora_studio.gui.engine_host import LOADING, EngineHost
from multilora_studio.gui.server_control import ServerControl
from multilora_studio.gui.widgets import format_bytes

STATE_LABELS = {"ready": "idle", "loading": "loading…", "failed": "failed", "stopped": "stopped"}


def separator() -> QFrame:
    line = QFrame()
    line.setFrameShape(QFrame.Shape.VLine)
    line.setFrameShadow(QFrame.Shadow.Plain)
    line.setStyleSheet("color: palette(mid);")
    return line


class StudioStatusBar(QStatusBar):
    def __init__(self, host: EngineHost, control: ServerControl, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.host = host
        self.control = control
        self.process = psutil.Process()
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setMaximumWidth(160)
        self.progress.setTextVisible(False)
        self.cancel = QToolButton()
        self.cancel.setText("Cancel")
        self.cancel.clicked.connect(host.cancel_start)
        self.state = QLabel()
        self.device = QLabel()
        self.model = QLabel()
        self.memory = QLabel()
        self.endpoint = QLabel()
        self.addPermanentWidget(self.progress)
        self.addPermanentWidget(self.cancel)
        for index, label in enumerate((self.state, self.device, self.model, self.memory, self.endpoint)):
            if index:
                self.addPermanentWidget(separator())
            self.addPermanentWidget(label)
        host.stateChanged.connect(lambda state: self.refresh(None))
        host.progress.connect(self._progress)
        host.failed.connect(lambda message: self.showMessage(f"The engine did not start: {message}"))
        control.stateChanged.connect(lambda state: self.refresh(None))
        self.refresh(None)

    def _progress(self, fraction: float, message: str) -> None:
        self.progress.setValue(int(fraction * 1000))
        self.showMessage(message, 10_000)

    def refresh(self, metrics: EngineMetrics | None) -> None:
        loading = self.host.state == LOADING
        self.progress.setVisible(loading)
        self.cancel.setVisible(loading)
        engine = self.host.engine
        state = metrics.state if metrics is not None and engine is not None else STATE_LABELS[self.host.state]
        self.state.setText(f"engine: {state}")
        where = metrics.device if metrics is not None else str(engine.device) if engine is not None else "-"
        self.device.setText(f"device: {where}")  # a replica set's: each replica's
        pool = self.host.pool
        names = pool.names if pool is not None else []
        self.model.setText(f"base{'s' if len(names) > 1 else ''}: {', '.join(names) or '-'}")
        if engine is not None and engine.device.type == "cuda":
            vram = format_bytes(metrics.device_memory_bytes) if metrics is not None else "-"
        else:
            vram = "n/a"
        ram = psutil.virtual_memory()
        self.memory.setText(
            f"VRAM: {vram} · RAM: {format_bytes(self.process.memory_info().rss)} of {format_bytes(ram.total)}"
        )
        self.endpoint.setText(f"endpoint: {self.control.url}/v1" if self.control.url else "endpoint: off")
