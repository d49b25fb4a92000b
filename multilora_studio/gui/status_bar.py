"""The status bar: device, base model, device memory and host RAM, engine state, endpoint URL."""

from __future__ import annotations

import psutil
from PySide6.QtWidgets import QLabel, QStatusBar, QWidget

from multilora_studio.engine import EngineMetrics
from multilora_studio.gui.engine_host import EngineHost
from multilora_studio.gui.server_control import ServerControl
from multilora_studio.gui.widgets import format_bytes


class StudioStatusBar(QStatusBar):
    def __init__(self, host: EngineHost, control: ServerControl, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.host = host
        self.control = control
        self.process = psutil.Process()
        self.state = QLabel()
        self.device = QLabel()
        self.model = QLabel()
        self.memory = QLabel()
        self.endpoint = QLabel()
        for label in (self.state, self.device, self.model, self.memory, self.endpoint):
            self.addPermanentWidget(label)
        host.stateChanged.connect(lambda state: self.refresh(None))
        host.progress.connect(lambda fraction, message: self.showMessage(message, 5000))
        control.stateChanged.connect(lambda state: self.refresh(None))
        self.refresh(None)

    def refresh(self, metrics: EngineMetrics | None) -> None:
        engine = self.host.engine
        labels = {"ready": "idle", "loading": "loading…", "failed": "failed", "stopped": "stopped"}
        state = metrics.state if metrics is not None and engine is not None else labels[self.host.state]
        self.state.setText(f"engine: {state}")
        self.device.setText(f"device: {engine.device}" if engine is not None else "device: -")
        self.model.setText(f"base: {engine.model_name}" if engine is not None else "base: -")
        device_memory = format_bytes(metrics.device_memory_bytes) if metrics is not None else "-"
        ram = psutil.virtual_memory()
        self.memory.setText(
            f"VRAM: {device_memory} · RAM: {format_bytes(self.process.memory_info().rss)} "
            f"of {format_bytes(ram.total)}"
        )
        url = f"{self.control.url}/v1" if self.control.url else "off"
        self.endpoint.setText(f"endpoint: {url}")
