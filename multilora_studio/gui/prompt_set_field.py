"""The Evaluate view's prompt set: a file's path, *Choose…*, and while the path is empty *Try the
demo prompt set* (the demo adapters' example set, ``demo.demo_prompt_set``)."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QLabel, QLineEdit, QPushButton, QWidget

from multilora_studio.demo import demo_prompt_set


class PromptSetField(QWidget):
    """``demoChosen`` fires when the demo prompt set was filled in (the view ticks its adapters)."""

    demoChosen = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.path = QLineEdit()
        self.path.setPlaceholderText("A prompt set: .jsonl (prompt or messages, reference, check) or .csv")
        browse = QPushButton("Choose…")
        browse.clicked.connect(self._choose_file)
        self.demo_button = QPushButton("Try the demo prompt set")
        self.demo_button.setToolTip(
            "Fill in the demo adapters' example prompt set (one prompt per adapter, each with a check "
            "of its style) and tick the base and the demo adapters"
        )
        self.demo_button.clicked.connect(self.use_demo)
        self.path.textChanged.connect(lambda text: self.demo_button.setVisible(not text.strip()))
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(QLabel("<b>Prompt set</b>"))
        row.addWidget(self.path, 1)
        row.addWidget(self.demo_button)
        row.addWidget(browse)

    def use_demo(self) -> None:
        self.path.setText(str(demo_prompt_set()))
        self.demoChosen.emit()

    def _choose_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose a prompt set", "", "Prompt sets (*.jsonl *.csv)")
        if path:
            self.path.setText(path)
