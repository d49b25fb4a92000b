"""The Evaluate view's result widgets: the prompt x adapter matrix, the scores, one prompt's drill-down."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QLabel,
    QPlainTextEdit,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from multilora_studio.evaluate import EvalResults
from multilora_studio.gui.widgets import KIND_COLORS

PASS_COLOR = QColor(KIND_COLORS["success"])
FAIL_COLOR = QColor(KIND_COLORS["error"])
CELL_ALPHA = 60  # a tint the text stays readable on, in light and dark themes
SHOWN_CHARS = 80
MARKS = {True: "✓ ", False: "✗ ", None: ""}


def tint(passed: bool | None) -> QBrush | None:
    if passed is None:
        return None
    color = QColor(PASS_COLOR if passed else FAIL_COLOR)
    color.setAlpha(CELL_ALPHA)
    return QBrush(color)


class MatrixTable(QTableWidget):
    """One row per prompt, one column per adapter: the output's start, tinted by pass or fail."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(0, 0, parent)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.setWordWrap(False)
        self.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)

    def show_results(self, results: EvalResults) -> None:
        self.clear()
        self.setRowCount(len(results.prompts))
        self.setColumnCount(len(results.adapters))
        self.setHorizontalHeaderLabels(results.adapters)
        self.setVerticalHeaderLabels([f"row {prompt.row}" for prompt in results.prompts])
        for index in range(len(results.prompts)):
            for column, cell in enumerate(results.row_cells(index)):
                shown = cell.chosen if cell.chosen is not None else " ".join(cell.output.split())
                item = QTableWidgetItem(MARKS[cell.passed] + shown[:SHOWN_CHARS])
                item.setToolTip(cell.output)
                item.setData(Qt.ItemDataRole.UserRole, cell.passed)
                brush = tint(cell.passed)
                if brush is not None:
                    item.setBackground(brush)
                self.setItem(index, column, item)


class ScoresTable(QTableWidget):
    """Per adapter: passed / checked, pass rate, mean log-probability per reference token."""

    COLUMNS = ("adapter", "passed", "pass rate", "reference log-prob / token")

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(0, len(self.COLUMNS), parent)
        self.setHorizontalHeaderLabels(list(self.COLUMNS))
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.verticalHeader().hide()

    def show_results(self, results: EvalResults) -> None:
        self.setRowCount(len(results.scores))
        for row, score in enumerate(results.scores):
            rate = "-" if score.pass_rate is None else f"{score.pass_rate:.1%}"
            logprob = score.reference_logprob_per_token
            values = (
                score.adapter,
                f"{score.passed}/{score.checked}",
                rate,
                "-" if logprob is None else f"{logprob:.4f}",
            )
            for column, value in enumerate(values):
                self.setItem(row, column, QTableWidgetItem(value))


class DrillDown(QWidget):
    """One prompt (with its reference and check) over its outputs side by side, one column per adapter."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.header = QLabel("Select a prompt in the matrix to see its outputs side by side.")
        self.header.setWordWrap(True)
        self.header.setTextFormat(Qt.TextFormat.RichText)
        self.header.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.columns = QSplitter(Qt.Orientation.Horizontal)
        self.columns.setChildrenCollapsible(False)
        self.outputs: list[QPlainTextEdit] = []
        self.titles: list[QLabel] = []
        self.boxes: list[QWidget] = []
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.header)
        layout.addWidget(self.columns, 1)
        self.setMinimumHeight(180)

    def show_row(self, results: EvalResults, index: int) -> None:
        prompt = results.prompts[index]
        lines = [f"<b>Row {prompt.row}</b>{' (chat)' if prompt.chat else ''}: {_escape(prompt.prompt)}"]
        if prompt.reference is not None:
            lines.append(f"<b>Reference</b>: {_escape(prompt.reference)}")
        if prompt.check is not None:
            lines.append(f"<b>Check</b>: {_escape(str(prompt.check))}")
        self.header.setText(" &nbsp;·&nbsp; ".join(lines))
        cells = results.row_cells(index)
        while len(self.outputs) < len(cells):
            box = QWidget()
            title, text = QLabel(), QPlainTextEdit()
            text.setReadOnly(True)
            column = QVBoxLayout(box)
            column.setContentsMargins(2, 2, 2, 2)
            column.addWidget(title)
            column.addWidget(text, 1)
            self.columns.addWidget(box)
            self.boxes.append(box)
            self.titles.append(title)
            self.outputs.append(text)
        for position, box in enumerate(self.boxes):
            box.setVisible(position < len(cells))
        for title, text, cell in zip(self.titles, self.outputs, cells, strict=False):
            verdict = {True: "pass", False: "fail", None: "no check"}[cell.passed]
            extra = f", chose {cell.chosen!r}" if cell.chosen is not None else ""
            logprob = "" if cell.reference_logprob is None else f", reference {cell.reference_logprob:.3f}"
            title.setText(f"<b>{_escape(cell.adapter)}</b>: {verdict}{_escape(extra)}{logprob}")
            text.setPlainText(cell.output)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
