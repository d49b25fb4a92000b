"""The history of Compare runs: pick a past run, read its record, rerun it."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QDialog,
    QHBoxLayout,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from multilora_studio.run_records import RunHistory, RunRecord


class RunHistoryDialog(QDialog):
    """Lists ``history`` newest first; *Rerun* emits ``rerunRequested(record)`` and closes."""

    rerunRequested = Signal(object)

    def __init__(self, history: RunHistory, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Compare runs")
        self.resize(900, 560)
        self.history = history
        self.runs = QListWidget()
        self.details = QPlainTextEdit(readOnly=True)
        self.details.setPlaceholderText("The selected run's record: everything needed to run it again")
        self.rerun_button = QPushButton("Rerun")
        self.rerun_button.setToolTip("Restore the run's prompts, settings and adapters and run it again")
        self.rerun_button.setEnabled(False)
        close = QPushButton("Close")
        self.runs.currentItemChanged.connect(self._selected)
        self.runs.itemDoubleClicked.connect(lambda item: self.rerun())
        self.rerun_button.clicked.connect(self.rerun)
        close.clicked.connect(self.reject)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.runs)
        split.addWidget(self.details)
        split.setStretchFactor(1, 1)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.rerun_button)
        buttons.addWidget(close)
        layout = QVBoxLayout(self)
        layout.addWidget(split, 1)
        layout.addLayout(buttons)
        self.refresh()

    def refresh(self) -> None:
        self.runs.clear()
        for record in self.history.records():
            item = QListWidgetItem(record.title())
            item.setData(Qt.ItemDataRole.UserRole, record)
            self.runs.addItem(item)
        if self.runs.count():
            self.runs.setCurrentRow(0)

    def selected(self) -> RunRecord | None:
        item = self.runs.currentItem()
        return None if item is None else item.data(Qt.ItemDataRole.UserRole)

    def _selected(self) -> None:
        record = self.selected()
        self.rerun_button.setEnabled(record is not None)
        self.details.setPlainText("" if record is None else record.to_json())

    def rerun(self) -> None:
        record = self.selected()
        if record is not None:
            self.rerunRequested.emit(record)
            self.accept()
