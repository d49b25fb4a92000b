"""One column of the Compare view: an adapter's streaming answer, its numbers and where it leaves the base."""

from __future__ import annotations

from PySide6.QtGui import QColor, QFont, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QFrame, QLabel, QTextEdit, QVBoxLayout, QWidget

from multilora_studio.engine import RequestOutput
from multilora_studio.gui.compare_run import BASE, ColumnUpdate
from multilora_studio.gui.diff import utf16_offset
from multilora_studio.gui.widgets import format_ms

HIGHLIGHT = QColor(255, 179, 0, 90)  # amber, readable on light and dark backgrounds


class CompareColumn(QFrame):
    """One request's text as it streams; text after the first difference from the base is highlighted."""

    def __init__(self, name: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.name = name
        self.text = ""
        self.tokens = 0
        self.ttft_s: float | None = None
        self.tokens_per_second: float | None = None
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.done = False
        self.diverges_at: int | None = None
        self.agreed = 0  # prefix length known to agree with the base
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setMinimumWidth(220)
        self.title = QLabel(f"<b>{name}</b>" + (" (no adapter)" if name == BASE else ""))
        self.stats = QLabel("waiting…")
        self.difference = QLabel("reference" if name == BASE else "")
        for label in (self.stats, self.difference):
            label.setStyleSheet("color: palette(placeholder-text);")
        self.view = QTextEdit(readOnly=True)
        self.view.setAcceptRichText(False)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addWidget(self.title)
        layout.addWidget(self.stats)
        layout.addWidget(self.difference)
        layout.addWidget(self.view, 1)

    def apply(self, update: ColumnUpdate) -> None:
        """Append new text and refresh the numbers (GUI thread)."""
        if update.text:
            self._insert(update.text)
        self.tokens = update.tokens
        self.ttft_s = update.ttft_s
        self.tokens_per_second = update.tokens_per_second
        if update.done and update.output is not None:
            self._finish(update.output)
        self._show_stats()

    def mark_divergence(self, index: int) -> None:
        """Highlight everything from character ``index`` on; later text is inserted highlighted."""
        self.diverges_at = index
        cursor = QTextCursor(self.view.document())
        cursor.setPosition(utf16_offset(self.text, index))
        cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
        cursor.mergeCharFormat(self._format(True))
        words = len(self.text[:index].split())
        self.difference.setText(f"differs from base at char {index} (after {words} words)")
        self.difference.setStyleSheet("color: #e65100;")

    def mark_same(self) -> None:
        self.difference.setText("same as base")

    def _finish(self, output: RequestOutput) -> None:
        self.done = True
        self.finish_reason = output.finish_reason
        self.error = output.error
        if output.text and output.text != self.text:  # the final text is authoritative
            mark, self.diverges_at = self.diverges_at, None
            self.view.clear()
            self.text = ""
            self._insert(output.text)
            if mark is not None:
                self.mark_divergence(mark)
        if output.error:
            self.difference.setText(output.error)
            self.difference.setStyleSheet("color: #c62828;")

    def _insert(self, text: str) -> None:
        cursor = QTextCursor(self.view.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(text, self._format(self.diverges_at is not None))
        self.text += text
        bar = self.view.verticalScrollBar()
        if bar.value() >= bar.maximum() - 40:
            bar.setValue(bar.maximum())

    def _format(self, highlighted: bool) -> QTextCharFormat:
        char_format = QTextCharFormat()
        char_format.setFontWeight(QFont.Weight.Normal)
        if highlighted:
            char_format.setBackground(HIGHLIGHT)
        else:
            char_format.clearBackground()
        return char_format

    def _show_stats(self) -> None:
        rate = "-" if self.tokens_per_second is None else f"{self.tokens_per_second:.1f} tok/s"
        parts = [f"{self.tokens} tok", rate, f"TTFT {format_ms(self.ttft_s)}"]
        if self.done:
            parts.append(self.finish_reason or "done")
        self.stats.setText(" · ".join(parts))
