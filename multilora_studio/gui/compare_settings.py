"""A column's own settings (temperature, max tokens, stop strings, seed) over the shared ones: a popup."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from multilora_studio.gui.stop_strings import format_stop_strings, parse_stop_strings
from multilora_studio.gui.workflows.compare_inputs import SEED_LIMIT
from multilora_studio.run_records import ColumnOverrides

SHARED = "shared"


class ColumnSettingsDialog(QDialog):
    """Edit one column's overrides; a field left at 'shared' takes the shared value.

    ``changed(name, overrides)`` fires on OK (and on *Use shared*, with no overrides).
    """

    changed = Signal(str, object)

    def __init__(self, name: str, overrides: ColumnOverrides, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.name = name
        self.setWindowTitle(f"Settings of {name}")
        self.temperature = QDoubleSpinBox(minimum=-0.05, maximum=5.0, singleStep=0.05, decimals=2)
        self.temperature.setSpecialValueText(SHARED)
        self.max_tokens = QSpinBox(minimum=0, maximum=32768)
        self.max_tokens.setSpecialValueText(SHARED)
        self.seed = QSpinBox(minimum=-1, maximum=SEED_LIMIT)
        self.seed.setSpecialValueText(SHARED)
        self.stop = QLineEdit()
        self.stop.setPlaceholderText("shared (comma-separated, \\n for a new line)")
        self.error = QLabel()
        self.error.setStyleSheet("color: #c62828;")
        self.error.setWordWrap(True)
        self.error.hide()
        form = QFormLayout()
        form.addRow("Temperature", self.temperature)
        form.addRow("Max tokens", self.max_tokens)
        form.addRow("Stop strings", self.stop)
        form.addRow("Seed", self.seed)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        self.reset_button = QPushButton("Use shared")
        buttons.addButton(self.reset_button, QDialogButtonBox.ButtonRole.ResetRole)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        self.reset_button.clicked.connect(self.reset)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel(f"<b>{name}</b>: settings of this column only"))
        layout.addLayout(form)
        layout.addWidget(self.error)
        layout.addWidget(buttons)
        self.show_overrides(overrides)

    def show_overrides(self, overrides: ColumnOverrides) -> None:
        self.temperature.setValue(
            self.temperature.minimum() if overrides.temperature is None else overrides.temperature
        )
        self.max_tokens.setValue(0 if overrides.max_tokens is None else overrides.max_tokens)
        self.seed.setValue(-1 if overrides.seed is None else overrides.seed)
        self.stop.setText("" if overrides.stop is None else format_stop_strings(overrides.stop))

    def overrides(self) -> ColumnOverrides:
        """What the fields say (ValueError for stop strings it cannot read)."""
        temperature = self.temperature.value()
        stop = self.stop.text().strip()
        return ColumnOverrides(
            temperature=None if temperature < 0 else temperature,
            max_tokens=self.max_tokens.value() or None,
            stop=parse_stop_strings(stop) if stop else None,
            seed=None if self.seed.value() < 0 else self.seed.value(),
        )

    def accept(self) -> None:
        try:
            overrides = self.overrides()
        except ValueError as error:
            self.error.setText(str(error))
            self.error.show()
            return
        self.changed.emit(self.name, overrides)
        super().accept()

    def reset(self) -> None:
        self.show_overrides(ColumnOverrides())
        self.changed.emit(self.name, ColumnOverrides())
        super().accept()
