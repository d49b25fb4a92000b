"""The Evaluate view's control groups, bound to ``workflows.evaluate_session``: the adapters of the
picked base with their ticks, the options, and the run's buttons, progress, summary and recent list."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from multilora_studio.gui.field_binding import bind_check, bind_number, bind_text_choice
from multilora_studio.gui.workflows.evaluate_inputs import DEFAULT_CHECKS, ENTRIES, TICKS, EvaluateInputs
from multilora_studio.gui.workflows.evaluate_session import RECENT, EvaluateSession

NAME = Qt.ItemDataRole.UserRole
EXPORTS = (("CSV", ".csv"), ("JSON", ".json"), ("Markdown", ".md"))


class EvaluateTicks(QWidget):
    """The base picker (shown when the window serves several bases), its adapters, All / None."""

    def __init__(self, inputs: EvaluateInputs, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.inputs = inputs
        self.adapters = QListWidget()
        self.adapters.setToolTip("Tick the adapters to evaluate; 'base' is the model without an adapter")
        self.adapters.itemChanged.connect(
            lambda item: inputs.set_ticked(item.data(NAME), item.checkState() == Qt.CheckState.Checked)
        )
        self.adapters.setMaximumHeight(120)
        self.base_picker = QComboBox()
        self.base_picker.setToolTip("The base model to evaluate on; its adapters are listed")
        self.base_picker.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.base_picker.currentIndexChanged.connect(
            lambda *_: inputs.pick_base(self.base_picker.currentData())
        )
        self.base_picker.hide()
        every, none = QPushButton("All"), QPushButton("None")
        every.clicked.connect(lambda: inputs.tick_all(True))
        none.clicked.connect(lambda: inputs.tick_all(False))
        ticks = QHBoxLayout()
        ticks.addWidget(QLabel("<b>Adapters</b>"), 1)
        for widget in (self.base_picker, every, none):
            ticks.addWidget(widget)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(ticks)
        layout.addWidget(self.adapters, 1)
        inputs.changed.connect(self._changed)

    def _changed(self, what: str) -> None:
        if what == ENTRIES:
            self._show_bases()
            self._show_entries()
        elif what == TICKS:
            for i in range(self.adapters.count()):
                item = self.adapters.item(i)
                state = (
                    Qt.CheckState.Checked
                    if item.data(NAME) in self.inputs.wanted
                    else Qt.CheckState.Unchecked
                )
                if item.checkState() != state:
                    item.setCheckState(state)

    def _show_bases(self) -> None:
        names = self.inputs.bases()
        self.base_picker.blockSignals(True)
        self.base_picker.clear()
        for name in names:
            self.base_picker.addItem(name, name)
        self.base_picker.setCurrentIndex(max(0, self.base_picker.findData(self.inputs.shown)))
        self.base_picker.blockSignals(False)
        self.base_picker.setVisible(len(names) > 1)

    def _show_entries(self) -> None:
        self.adapters.blockSignals(True)
        self.adapters.clear()
        for name in self.inputs.listed():
            item = QListWidgetItem(name)
            item.setData(NAME, name)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(
                Qt.CheckState.Checked if name in self.inputs.wanted else Qt.CheckState.Unchecked
            )
            self.adapters.addItem(item)
        self.adapters.blockSignals(False)


class EvaluateOptions:
    """Max tokens, the check of rows without one, chat."""

    def __init__(self, inputs: EvaluateInputs) -> None:
        self.max_tokens = QSpinBox(minimum=0, maximum=32768)
        self.max_tokens.setToolTip("0: score references and choices only, generate nothing")
        self.chat = QCheckBox("Send text prompts as chat")
        self.default_check = QComboBox()
        self.default_check.addItems(list(DEFAULT_CHECKS))
        self.default_check.setToolTip(
            "The check of rows that have none (exact and contains need a reference)"
        )
        bind_number(inputs, "max_tokens", self.max_tokens)
        bind_check(inputs, "chat", self.chat)
        bind_text_choice(inputs, "default_check", self.default_check)

    def lay_out(self, form: QFormLayout) -> None:
        form.addRow("Max tokens", self.max_tokens)
        form.addRow("Default check", self.default_check)
        form.addRow(self.chat)


class EvaluateRunControls:
    """Run, Rerun…, Cancel, the progress, the exports, the summary and the saved evaluations; the view
    connects the buttons."""

    def __init__(self, session: EvaluateSession) -> None:
        self.session = session
        self.run_button = QPushButton("Run")
        self.rerun_button = QPushButton("Rerun…")
        self.rerun_button.setToolTip(
            "Run a saved evaluation again: the same prompt set, adapters and settings"
        )
        self.cancel_button = QPushButton("Cancel")
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setValue(0)
        self.summary = QLabel()
        self.summary.setWordWrap(True)
        self.export_buttons = [QPushButton(f"Save {label}…") for label, _ in EXPORTS]
        self.recent = QListWidget()
        self.recent.setToolTip("Saved evaluations, newest first: double-click one to run it again")
        self.recent.setMaximumHeight(90)
        session.changed.connect(self._changed)
        for what in ("running", RECENT):
            self._changed(what)
        for button in self.export_buttons:
            button.setEnabled(False)

    def _changed(self, what: str) -> None:
        session = self.session
        if what == "running":
            self.run_button.setEnabled(not session.running)
            self.rerun_button.setEnabled(not session.running)
            self.cancel_button.setEnabled(session.running)
        elif what == "summary":
            self.summary.setText(session.summary)
        elif what == RECENT:
            self.recent.clear()
            for path in session.recent():
                item = QListWidgetItem(path.stem)
                item.setData(NAME, str(path))
                item.setToolTip(str(path))
                self.recent.addItem(item)

    def show_progress(self, fraction: float, message: str) -> None:
        self.progress.setValue(round(fraction * 1000))
        self.progress.setFormat(message)

    def lay_out(self, row: QHBoxLayout) -> None:
        for widget in (self.run_button, self.rerun_button, self.cancel_button):
            row.addWidget(widget)
        row.addWidget(self.progress, 1)
        for button in self.export_buttons:
            row.addWidget(button)
