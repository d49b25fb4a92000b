"""Settings' fields made from setting declarations (``engine/settings.py``): a check box, a list of
choices, a number within the setting's bounds or a line of text, labelled in the window's words,
with what None means as the field's empty value (0 or "": None)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QCheckBox, QComboBox, QDoubleSpinBox, QFormLayout, QLineEdit, QSpinBox, QWidget

from multilora_studio.engine.settings import Declared

FORM_MAX = 1 << 20  # the largest value a field offers for a setting without an upper bound


def field_widget(item: Declared, none: str | None = None) -> QWidget:
    """The field for ``item``; ``none``: the words for its empty value (0 or ""), which every field
    then has (a base's own settings: "as Engine"), else the declaration's when None is allowed."""
    rules = item.setting
    empty = none if none is not None else rules.none if item.optional else None
    widget: QWidget
    if item.kind is bool:
        widget = QCheckBox()
    elif rules.choices:
        widget = QComboBox()
        if empty is not None:
            widget.addItem(empty, "")
        for choice in rules.choices:
            widget.addItem(choice, choice)
    elif item.kind is int:
        widget = spin_box(item, empty)
    elif item.kind is float:
        widget = _double_spin_box(item, empty)
    else:
        widget = QLineEdit(placeholderText=empty or "")
    widget.setToolTip(rules.tip)
    return widget


def spin_box(item: Declared, empty: str | None = None) -> QSpinBox:
    """The field of an integer setting: its bounds, its unit, ``empty`` the words for 0 (then its
    lowest value)."""
    spin = QSpinBox(minimum=int(_lowest(item, empty)), maximum=int(_highest(item)), suffix=item.setting.unit)
    if empty is not None:
        spin.setSpecialValueText(empty)
    return spin


def _double_spin_box(item: Declared, empty: str | None) -> QDoubleSpinBox:
    step = item.setting.step
    decimals = max(0, math.ceil(-math.log10(step))) if step < 1 else 0
    spin = QDoubleSpinBox(
        minimum=_lowest(item, empty), maximum=_highest(item), decimals=decimals, singleStep=step
    )
    spin.setSuffix(item.setting.unit)
    if empty is not None:
        spin.setSpecialValueText(empty)
    return spin


def _lowest(item: Declared, empty: str | None) -> float:
    return 0 if empty is not None else item.setting.low or 0


def _highest(item: Declared) -> float:
    return item.setting.high if item.setting.high is not None else FORM_MAX


def read(widget: QWidget) -> Any:
    """The value a field made by ``field_widget`` (or an editable list of text) holds."""
    if isinstance(widget, QCheckBox):
        return widget.isChecked()
    if isinstance(widget, QComboBox):
        return widget.currentText().strip() if widget.isEditable() else widget.currentData()
    if isinstance(widget, (QSpinBox, QDoubleSpinBox)):
        return widget.value()
    if isinstance(widget, QLineEdit):
        return widget.text().strip()
    raise TypeError(f"no setting field: {widget!r}")


def show(widget: QWidget, value: Any) -> None:
    """Show ``value`` in a field made by ``field_widget`` (or an editable list of text)."""
    if isinstance(widget, QCheckBox):
        widget.setChecked(bool(value))
    elif isinstance(widget, QComboBox) and widget.isEditable():
        widget.setCurrentText(str(value))
    elif isinstance(widget, QComboBox):
        widget.setCurrentIndex(max(0, widget.findData(value if value is not None else "")))
    elif isinstance(widget, (QSpinBox, QDoubleSpinBox)):
        widget.setValue(value or 0)
    elif isinstance(widget, QLineEdit):
        widget.setText(value or "")


class SettingForm(QObject):
    """Rows of settings' fields in one ``QFormLayout`` (``layout``), each labelled with its
    setting's label (and its field name where ``named``); ``fields`` by setting name; ``edited``
    when the user changes one (not when ``show`` does)."""

    edited = Signal()

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.layout = QFormLayout()
        self.fields: dict[str, QWidget] = {}
        self._showing = False

    def add(
        self,
        items: Iterable[Declared],
        named: bool = False,
        none: str | None = None,
        widgets: Mapping[str, QWidget] | None = None,
    ) -> None:
        """A row per setting of ``items``: its field from ``field_widget`` (``none`` as there), or
        the one ``widgets`` gives for it; ``named``: ``Label (field_name)`` for the names with an
        underscore (the Python API's and the flags' names)."""
        for item in items:
            widget = (widgets or {}).get(item.name) or field_widget(item, none)
            label = str(item.setting.label)
            if named and "_" in item.name:
                label = f"{label} ({item.name})"
            self.layout.addRow(label, widget)
            self.fields[item.name] = widget
            self._watch(widget)

    def values(self) -> dict[str, Any]:
        return {name: read(widget) for name, widget in self.fields.items()}

    def show(self, values: Mapping[str, Any]) -> None:
        """Show the values of ``values`` this form has a field for."""
        self._showing = True
        try:
            for name, widget in self.fields.items():
                if name in values:
                    show(widget, values[name])
        finally:
            self._showing = False

    def _watch(self, widget: QWidget) -> None:
        signals = {
            QCheckBox: ("toggled",),
            QComboBox: ("currentIndexChanged", "editTextChanged"),
            QSpinBox: ("valueChanged",),
            QDoubleSpinBox: ("valueChanged",),
            QLineEdit: ("textChanged",),
        }[type(widget)]
        for name in signals:
            getattr(widget, name).connect(self._changed)

    def _changed(self, *_: object) -> None:
        if not self._showing:
            self.edited.emit()
