"""The Compare view's input controls, each group bound two-way to ``workflows.compare_inputs``."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from multilora_studio.gui.field_binding import bind_check, bind_choice, bind_number, bind_text
from multilora_studio.gui.workflows.compare_inputs import RANDOM_SEED, SEED_LIMIT, VIEWS, CompareInputs


class MessageControls:
    """The system prompt, the message and *Raw prompt* (a raw prompt has no system prompt)."""

    def __init__(self, inputs: CompareInputs) -> None:
        self.system = QPlainTextEdit()
        self.system.setPlaceholderText("System prompt (optional; chat only)")
        self.system.setTabChangesFocus(True)
        self.system.setMaximumHeight(64)
        self.prompt = QPlainTextEdit()
        self.prompt.setPlaceholderText(
            "Type a message; Ctrl+Enter runs it through every ticked adapter, Ctrl+Shift+Enter follows up"
        )
        self.prompt.setTabChangesFocus(True)
        self.raw = QCheckBox("Raw prompt (no chat template)")
        self.raw.toggled.connect(lambda raw: self.system.setEnabled(not raw))
        bind_text(inputs, "system_prompt", self.system)
        bind_text(inputs, "message", self.prompt)
        bind_check(inputs, "raw", self.raw)

    def lay_out(self, box: QVBoxLayout) -> None:
        box.addWidget(QLabel("<b>System prompt</b>"))
        box.addWidget(self.system)
        box.addWidget(QLabel("<b>Message</b>"))
        box.addWidget(self.prompt, 1)
        box.addWidget(self.raw)

    def widgets(self) -> list[QWidget]:
        return [self.system, self.prompt, self.raw]


class SamplingControls:
    """The shared settings and how answers show."""

    def __init__(self, inputs: CompareInputs) -> None:
        self.max_tokens = QSpinBox(minimum=1, maximum=32768)
        self.temperature = QDoubleSpinBox(minimum=0.0, maximum=5.0, singleStep=0.1, decimals=2)
        self.top_p = QDoubleSpinBox(minimum=0.01, maximum=1.0, singleStep=0.05, decimals=2)
        self.seed = QSpinBox(minimum=RANDOM_SEED, maximum=SEED_LIMIT)
        self.seed.setSpecialValueText("random")
        self.seed.setToolTip("random: each run draws a seed and records it, so it can be rerun")
        self.stop = QLineEdit()
        self.stop.setPlaceholderText("comma-separated; \\n new line, \\, comma")
        self.ignore_eos = QCheckBox("Ignore end of sequence")
        self.view = QComboBox()
        for key, label in VIEWS.items():
            self.view.addItem(label, key)
        for name in ("max_tokens", "temperature", "top_p", "seed"):
            bind_number(inputs, name, getattr(self, name))
        bind_text(inputs, "stop", self.stop)
        bind_check(inputs, "ignore_eos", self.ignore_eos)
        bind_choice(inputs, "view", self.view)

    def lay_out(self, form: QFormLayout) -> None:
        form.addRow("Max tokens", self.max_tokens)
        form.addRow("Temperature", self.temperature)
        form.addRow("Top p", self.top_p)
        form.addRow("Seed", self.seed)
        form.addRow("Stop strings", self.stop)
        form.addRow(self.ignore_eos)
        form.addRow("Show", self.view)

    def widgets(self) -> list[QWidget]:
        return [
            self.max_tokens,
            self.temperature,
            self.top_p,
            self.seed,
            self.stop,
            self.ignore_eos,
            self.view,
        ]
