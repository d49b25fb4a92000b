"""The Compare view's column choices: the adapter list with its ticks, the base picker, All / None,
a column's settings, the strength sweep and the slot warning; bound to ``workflows.compare_choices``."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from multilora_studio.gui.workflows.compare_choices import ENTRIES, TICKS, Entry
from multilora_studio.gui.workflows.compare_session import CompareSession
from multilora_studio.run_records import SWEEP_STRENGTHS

ALL_BASES = "All bases"
NAME = Qt.ItemDataRole.UserRole


class AdapterTicks(QWidget):
    """``settingsRequested(name)``: the ⚙ asks for the selected column's own settings."""

    settingsRequested = Signal(str)

    def __init__(self, session: CompareSession, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.choices = choices = session.choices
        self.adapters = QListWidget()
        self.adapters.setToolTip("Tick the adapters to compare; 'base' is the model without an adapter")
        self.adapters.itemChanged.connect(
            lambda item: choices.set_ticked(item.data(NAME), item.checkState() == Qt.CheckState.Checked)
        )
        self.base_picker = base_picker()
        self.base_picker.currentIndexChanged.connect(
            lambda *_: choices.pick_base(self.base_picker.currentData())
        )
        self.slot_warning = QLabel()
        self.slot_warning.setWordWrap(True)
        self.slot_warning.setStyleSheet("color: #b26a00;")
        self.slot_warning.hide()
        choices.changed.connect(self._changed)
        self._lay_out()

    def _lay_out(self) -> None:
        every, none, settings, sweep = (QPushButton(text) for text in ("All", "None", "⚙", "Strength sweep"))
        every.clicked.connect(lambda: self.choices.tick_all(True))
        none.clicked.connect(lambda: self.choices.tick_all(False))
        settings.setToolTip("Settings of the selected adapter's column")
        settings.clicked.connect(self._settings_of_selected)
        sweep.setToolTip(
            "The selected adapter at strengths "
            + ", ".join(f"{s:g}" for s in SWEEP_STRENGTHS)
            + " beside the base, in one batch"
        )
        sweep.clicked.connect(lambda: self.session.sweep_selected(self.selected()))
        ticks = QHBoxLayout()
        ticks.addWidget(QLabel("<b>Adapters</b>"), 1)
        for widget in (self.base_picker, every, none, settings, sweep):
            ticks.addWidget(widget)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(ticks)
        layout.addWidget(self.adapters, 1)
        layout.addWidget(self.slot_warning)

    def selected(self) -> str | None:
        item = self.adapters.currentItem()
        return None if item is None else item.data(NAME)

    def _settings_of_selected(self) -> None:
        name = self.selected()
        if name is None:
            self.session.tell("Select an adapter in the list first.", "info")
        else:
            self.settingsRequested.emit(name)

    def _changed(self, what: str) -> None:
        if what == TICKS:
            self._show_ticks()
        elif what in (ENTRIES, "picked_base"):
            self._show_bases()
            self._show_entries(self.choices.entries())
        else:
            return
        self._show_slot_warning()

    def _show_bases(self) -> None:
        """The base picker lists every base (shown only when there are several)."""
        names = self.choices.bases()
        picker = self.base_picker
        picker.setVisible(len(names) > 1)
        picker.blockSignals(True)
        if [picker.itemData(i) for i in range(1, picker.count())] != names:
            picker.clear()
            picker.addItem(ALL_BASES, None)
            for name in names:
                picker.addItem(name, name)
        picker.setCurrentIndex(max(0, picker.findData(self.choices.picked_base)))
        picker.blockSignals(False)

    def _show_entries(self, entries: list[Entry]) -> None:
        self.adapters.blockSignals(True)
        self.adapters.clear()
        for entry in entries:
            item = QListWidgetItem(entry.label + ("  ⚙" if entry.own_settings else ""))
            item.setData(NAME, entry.name)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(
                Qt.CheckState.Checked if entry.name in self.choices.wanted else Qt.CheckState.Unchecked
            )
            if entry.own_settings:
                item.setToolTip(f"{entry.name} has its own settings (the ⚙ of its column)")
            self.adapters.addItem(item)
        self.adapters.blockSignals(False)

    def _show_ticks(self) -> None:
        """Each item's tick as the choices hold it (an edit of the list, like any other, is seen)."""
        for i in range(self.adapters.count()):
            item = self.adapters.item(i)
            ticked = item.data(NAME) in self.choices.wanted
            state = Qt.CheckState.Checked if ticked else Qt.CheckState.Unchecked
            if item.checkState() != state:
                item.setCheckState(state)
        self.adapters.viewport().update()

    def _show_slot_warning(self) -> None:
        warning = self.choices.slot_warning()
        if warning is not None:
            self.slot_warning.setText(warning)
        self.slot_warning.setVisible(warning is not None)


def base_picker() -> QComboBox:
    picker = QComboBox()
    picker.setToolTip("List the adapters of every base model, or of one")
    picker.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
    picker.setMinimumWidth(picker.fontMetrics().horizontalAdvance(ALL_BASES) + 48)
    picker.hide()
    return picker
