"""Small shared widgets and formatting: the message banner, sizes and times."""

from __future__ import annotations

import time
from collections.abc import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractButton,
    QComboBox,
    QDoubleSpinBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QListWidget,
    QPlainTextEdit,
    QScrollArea,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

KIND_COLORS = {"error": "#c62828", "warning": "#b26a00", "info": "#1565c0", "success": "#2e7d32"}


def scroll_as_one_page(view: QWidget, content: QWidget) -> None:
    """Fill ``view`` with ``content`` in a frameless scroll area: the whole view scrolls in a
    small window."""
    page = QScrollArea()
    page.setWidgetResizable(True)
    page.setFrameShape(QScrollArea.Shape.NoFrame)
    page.setWidget(content)
    outer = QVBoxLayout(view)
    outer.setContentsMargins(0, 0, 0, 0)
    outer.addWidget(page)


def read_only_table(columns: tuple[str, ...] | list[str], min_height: int, max_height: int) -> QTableWidget:
    """A table of ``columns`` that cannot be edited, without row numbers, between two heights; each
    column as wide as its header and its texts (the last one takes the room left)."""
    table = QTableWidget(0, len(columns))
    table.setHorizontalHeaderLabels(list(columns))
    table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    table.horizontalHeader().setStretchLastSection(True)
    table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
    table.verticalHeader().setVisible(False)
    table.setMinimumHeight(min_height)
    table.setMaximumHeight(max_height)
    return table


def fill_rows(table: QTableWidget, rows: list[tuple[str, ...]]) -> None:
    """Show ``rows`` of text in ``table``, keeping its items and setting only the texts that changed
    (a selection or scroll position survives a refresh)."""
    table.setRowCount(len(rows))
    for r, row in enumerate(rows):
        for c, value in enumerate(row):
            item = table.item(r, c)
            if item is None:
                table.setItem(r, c, QTableWidgetItem(value))
            elif item.text() != value:
                item.setText(value)


def on_any_edit(callback: Callable[[], None], widgets: list[QWidget]) -> None:
    """Call ``callback`` whenever a person edits any of ``widgets`` (text, ticks, values, choices)."""
    for widget in widgets:
        if isinstance(widget, (QPlainTextEdit, QLineEdit)):
            widget.textChanged.connect(lambda *_: callback())
        elif isinstance(widget, QAbstractButton):
            widget.toggled.connect(lambda *_: callback())
        elif isinstance(widget, (QSpinBox, QDoubleSpinBox)):
            widget.valueChanged.connect(lambda *_: callback())
        elif isinstance(widget, QComboBox):
            widget.currentTextChanged.connect(lambda *_: callback())
        elif isinstance(widget, QListWidget):
            widget.itemChanged.connect(lambda *_: callback())
        else:
            raise TypeError(f"cannot watch edits of {type(widget).__name__}")


class MessageBanner(QWidget):
    """A dismissable one-line message at the top of a view (errors are shown here, never as tracebacks)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.kind = ""
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        close = QToolButton()
        close.setText("✕")
        close.setAutoRaise(True)
        close.clicked.connect(self.clear)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 4, 4, 4)
        layout.addWidget(self.label, 1)
        layout.addWidget(close, 0, Qt.AlignmentFlag.AlignTop)
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self.hide()

    @property
    def text(self) -> str:
        return self.label.text()

    def show_message(self, text: str, kind: str = "error") -> None:
        self.kind = kind
        color = KIND_COLORS.get(kind, KIND_COLORS["info"])
        self.setStyleSheet(
            f"MessageBanner {{ border: 1px solid {color}; border-radius: 4px; }} QLabel {{ color: {color}; }}"
        )
        self.label.setText(text)
        self.show()

    def clear(self) -> None:
        self.kind = ""
        self.label.clear()
        self.hide()


def format_bytes(size: float | None) -> str:
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def format_time(stamp: float | None) -> str:
    return "" if not stamp else time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp))


def format_ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"
