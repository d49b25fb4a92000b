"""Two-way binding of input widgets to a workflow model's fields: an edit sets the field, a change
of the field shows in the widget (``workflows.events``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import SignalInstance
from PySide6.QtWidgets import QAbstractButton, QComboBox, QDoubleSpinBox, QLineEdit, QPlainTextEdit, QSpinBox

from multilora_studio.gui.workflows.events import Observable


def bind(
    model: Observable, name: str, edited: SignalInstance, read: Callable[[], Any], show: Callable[[Any], None]
) -> None:
    """Bind field ``name`` of ``model`` to a widget: ``edited`` fires on its edits, ``read`` gives its
    value, ``show`` sets it. The widget starts with the field's value; a value the widget cannot hold
    (past its bounds, finer than its steps) becomes the field's as the widget holds it."""

    def from_widget(*_: Any) -> None:
        setattr(model, name, read())

    def from_model(changed: str) -> None:
        if changed != name:
            return
        value = getattr(model, name)
        if read() != value:
            show(value)
        if read() != value:
            setattr(model, name, read())

    edited.connect(from_widget)
    model.changed.connect(from_model)
    from_model(name)


def bind_text(model: Observable, name: str, edit: QPlainTextEdit | QLineEdit) -> None:
    if isinstance(edit, QPlainTextEdit):
        bind(model, name, edit.textChanged, edit.toPlainText, edit.setPlainText)
    else:
        bind(model, name, edit.textChanged, edit.text, edit.setText)


def bind_check(model: Observable, name: str, box: QAbstractButton) -> None:
    bind(model, name, box.toggled, box.isChecked, box.setChecked)


def bind_number(model: Observable, name: str, spin: QSpinBox | QDoubleSpinBox) -> None:
    bind(model, name, spin.valueChanged, spin.value, spin.setValue)


def bind_choice(model: Observable, name: str, combo: QComboBox) -> None:
    """``combo``'s item data is the field's value (an unknown value shows, and becomes, the first item)."""
    bind(
        model,
        name,
        combo.currentIndexChanged,
        combo.currentData,
        lambda v: combo.setCurrentIndex(max(0, combo.findData(v))),
    )


def bind_text_choice(model: Observable, name: str, combo: QComboBox) -> None:
    """``combo``'s item text is the field's value (an unknown value shows, and becomes, the first item)."""
    bind(
        model,
        name,
        combo.currentIndexChanged,
        combo.currentText,
        lambda v: combo.setCurrentIndex(max(0, combo.findText(v))),
    )
