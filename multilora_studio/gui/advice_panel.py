"""The Monitor's cache advice: the endpoint's recorded traffic replayed through the tier model
(``bench/advisor.py``), and *Apply* to restart the engine with the recommended slots and host tier."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QGroupBox, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from multilora_studio.bench.advisor import Advice, TraceRequest, advise, render
from multilora_studio.engine.serving_engine import metrics_of
from multilora_studio.gui.engine_host import EngineHost
from multilora_studio.gui.tasks import Task
from multilora_studio.server.usage import UsageLedger


class AdvicePanel(QGroupBox):
    """``applyRequested(max_loras, max_cpu_loras)`` asks the window to restart the engine with them."""

    applyRequested = Signal(int, int)

    def __init__(self, usage: UsageLedger, host: EngineHost, parent: QWidget | None = None) -> None:
        super().__init__("Cache advice from the endpoint's traffic", parent)
        self.usage = usage
        self.host = host
        self.advice: Advice | None = None
        self.advise_button = QPushButton("Advise")
        self.advise_button.setToolTip("Replay the requests the endpoint served through a model of the slots")
        self.advise_button.clicked.connect(self.compute)
        self.apply_button = QPushButton("Apply and restart the engine")
        self.apply_button.setEnabled(False)
        self.apply_button.clicked.connect(self._apply)
        self.text = QLabel("Serve requests through the endpoint, then ask for advice.")
        self.text.setWordWrap(True)
        self.text.setStyleSheet("font-family: monospace;")
        buttons = QHBoxLayout()
        buttons.addWidget(self.advise_button)
        buttons.addWidget(self.apply_button)
        buttons.addStretch(1)
        layout = QVBoxLayout(self)
        layout.addLayout(buttons)
        layout.addWidget(self.text)

    def compute(self) -> Task:
        """Advice for the traffic recorded so far, against the running engine's settings, on a
        task thread (a replay of 100,000 requests takes seconds); shown when it is done."""
        trace = [
            TraceRequest(r.time, r.adapter, r.adapter_tier, r.ttft_s, r.latency_s)
            for r in self.usage.records()
            if r.status == 200
        ]
        engine = self.host.engine
        snapshot = metrics_of(engine)
        recorded = (engine.config.max_loras, snapshot.cpu_capacity) if engine and snapshot else None
        self.advice = None
        self.advise_button.setEnabled(False)
        self.apply_button.setEnabled(False)
        self.text.setText(f"Replaying {len(trace)} requests…")

        def shown(advice: Advice | None) -> None:
            self.advice = advice
            self.text.setText(render(advice) if advice else "No requests recorded yet.")
            settings = (advice.recommended.max_loras, advice.recommended.max_cpu_loras) if advice else None
            self.apply_button.setEnabled(
                settings is not None and recorded is not None and settings != recorded
            )

        def refused(message: str) -> None:  # no adapter requests yet
            self.text.setText(message)

        return self.host.tasks.run(
            "advise",
            lambda task: advise(trace, recorded=recorded) if trace else None,
            shown,
            refused,
            on_done=lambda: self.advise_button.setEnabled(True),
        )

    def _apply(self) -> None:
        if self.advice is not None:
            best = self.advice.recommended
            self.applyRequested.emit(best.max_loras, best.max_cpu_loras)
