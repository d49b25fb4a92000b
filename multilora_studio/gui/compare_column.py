"""One column of the Compare view: an adapter's conversation, its numbers and where it leaves the base.

The last answer streams in; it shows as Markdown, as plain text with the part after the first
difference from the base highlighted, or as tokens coloured by their divergence from the base.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontMetrics,
    QResizeEvent,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
)
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QSizePolicy,
    QTextBrowser,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from multilora_studio.divergence import TokenDivergence
from multilora_studio.engine import RequestOutput
from multilora_studio.gui.compare_run import ColumnUpdate
from multilora_studio.gui.diff import utf16_offset
from multilora_studio.run_records import BASE, ColumnOverrides

HIGHLIGHT = QColor(255, 179, 0, 90)  # amber, readable on light and dark backgrounds
MORE_LIKELY = (46, 160, 67)  # green: the adapter makes the token more likely than the base does
LESS_LIKELY = (220, 50, 47)  # red: less likely
DIVERGENCE_SCALE = 4.0  # nats of |delta| that get the strongest colour
RENDER_MS = 40  # a streaming answer is drawn again at most this often
MARKDOWN, PLAIN, TOKENS = "markdown", "plain", "tokens"
USER_BACKGROUND = QColor(127, 127, 127, 40)  # the user's turns: grey on light and dark themes


def format_seconds(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f} s"


def divergence_color(delta: float) -> QColor:
    """A token's background: green when more likely under the adapter, red when less, by how much."""
    strength = min(1.0, abs(delta) / DIVERGENCE_SCALE)
    red, green, blue = MORE_LIKELY if delta > 0 else LESS_LIKELY
    return QColor(red, green, blue, int(200 * strength))


def divergence_tooltip(token: TokenDivergence, decode: Callable[[int], str]) -> str:
    """HTML for a token's tooltip: both log-probabilities and both lists of top alternatives."""

    def rows(top: tuple[tuple[int, float], ...]) -> str:
        return "".join(
            f"<tr><td><code>{html.escape(repr(decode(token_id)))}</code></td>"
            f"<td align='right'>{logprob:.2f}</td><td align='right'>{math.exp(logprob):.1%}</td></tr>"
            for token_id, logprob in top
        )

    return (
        f"<b><code>{html.escape(repr(token.text))}</code></b> Δ {token.delta:+.2f} nats<br>"
        f"adapter: log p {token.logprob:.2f} ({math.exp(token.logprob):.1%}) · "
        f"base: log p {token.base_logprob:.2f} ({math.exp(token.base_logprob):.1%})"
        f"<table><tr><th colspan=3 align='left'>adapter's top</th></tr>{rows(token.top)}"
        f"<tr><th colspan=3 align='left'>base's top</th></tr>{rows(token.base_top)}</table>"
    )


class CompareColumn(QFrame):
    """One request's conversation; ``text`` is its last answer as it streams. ``base``: the base
    model it runs on, named in its header (empty: not named, the window serves one base);
    ``reference``: the model without an adapter (default: the column named 'base')."""

    settingsRequested = Signal(str)

    def __init__(
        self, name: str, parent: QWidget | None = None, base: str = "", reference: bool | None = None
    ) -> None:
        super().__init__(parent)
        self.name = name
        self.base = base
        self.reference = name == BASE if reference is None else reference
        self.text = ""
        self.history: list[tuple[str, str]] = []  # earlier (user, answer) turns of this column
        self.user_text = ""  # the user turn the last answer replies to
        self.mode = MARKDOWN
        self.tokens = 0
        self.ttft_s: float | None = None
        self.queue_s: float | None = None
        self.tokens_per_second: float | None = None
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.output: RequestOutput | None = None
        self.done = False
        self.diverges_at: int | None = None
        self.agreed = 0  # prefix length known to agree with the base
        self.divergence: list[TokenDivergence] | None = None
        self.decode: Callable[[int], str] = str
        self.answer_start = 0  # where the last answer begins in the document
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setMinimumWidth(220)
        self.title = QLabel()
        self.title.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.title.setToolTip(
            name
            + (" (the model without an adapter)" if self.reference else "")
            + (f" on base model {base}" if base else "")
        )
        self.settings_button = QToolButton()
        self.settings_button.setText("⚙")
        self.settings_button.setAutoRaise(True)
        self.settings_button.setToolTip(f"Settings of the {name} column (override the shared ones)")
        self.settings_button.clicked.connect(lambda: self.settingsRequested.emit(self.name))
        self.overrides = QLabel()
        self.stats = QLabel("waiting…")
        self.stats.setWordWrap(True)
        self.difference = QLabel("reference" if self.reference else "")
        self.difference.setWordWrap(True)
        self.divergence_note = QLabel()
        self.divergence_note.setWordWrap(True)
        self.divergence_note.setToolTip(
            "log p(token) under the adapter minus under the base: green more likely under the adapter, "
            "red less; hover a token for both models' top alternatives"
        )
        self.divergence_note.hide()
        for label in (self.stats, self.difference, self.overrides, self.divergence_note):
            label.setStyleSheet("color: palette(placeholder-text);")
        self.view = QTextBrowser()
        self.view.setOpenLinks(False)
        self._render_timer = QTimer(self)
        self._render_timer.setSingleShot(True)
        self._render_timer.setInterval(RENDER_MS)
        self._render_timer.timeout.connect(self.redraw)
        header = QHBoxLayout()
        header.addWidget(self.title, 1)
        header.addWidget(self.settings_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addLayout(header)
        layout.addWidget(self.overrides)
        layout.addWidget(self.stats)
        layout.addWidget(self.difference)
        layout.addWidget(self.divergence_note)
        layout.addWidget(self.view, 1)
        self._elide_title()
        self.show_overrides(ColumnOverrides())

    # ---------------------------------------------------------------- turns

    def begin_turn(self, history: list[tuple[str, str]], user_text: str) -> None:
        """Start a new answer to ``user_text`` after ``history`` (this column's earlier turns)."""
        self.history = list(history)
        self.user_text = user_text
        self.text = ""
        self.tokens = 0
        self.ttft_s = self.queue_s = self.tokens_per_second = None
        self.finish_reason = self.error = None
        self.output = None
        self.done = False
        self.diverges_at = None
        self.agreed = 0
        self.divergence = None
        self.divergence_note.hide()
        self.stats.setText("waiting…")
        self.difference.setText("reference" if self.reference else "")
        self.difference.setStyleSheet("color: palette(placeholder-text);")
        self.redraw()

    def apply(self, update: ColumnUpdate) -> None:
        """Append new text and refresh the numbers (GUI thread)."""
        self.text += update.text
        self.tokens = update.tokens
        self.ttft_s = update.ttft_s
        self.queue_s = update.queue_s
        self.tokens_per_second = update.tokens_per_second
        if update.done and update.output is not None:
            self._finish(update.output)
            self.redraw()
        elif update.text and not self._render_timer.isActive():
            self._render_timer.start()
        self._show_stats()

    def _finish(self, output: RequestOutput) -> None:
        self.done = True
        self.output = output
        self.finish_reason = output.finish_reason
        self.error = output.error
        if output.text and output.text != self.text:  # the final text is authoritative
            self.text = output.text
        if output.error:
            self.difference.setText(output.error)
            self.difference.setStyleSheet("color: #c62828;")

    # ---------------------------------------------------------------- differences

    def mark_divergence(self, index: int) -> None:
        """The answer leaves the base's at character ``index`` (highlighted in the plain view)."""
        self.diverges_at = index
        words = len(self.text[:index].split())
        self.difference.setText(f"differs from base at char {index} (after {words} words)")
        self.difference.setStyleSheet("color: #e65100;")
        if self.mode == PLAIN:
            self.redraw()

    def mark_same(self) -> None:
        self.difference.setText("same as base")

    def show_divergence(self, tokens: list[TokenDivergence], decode: Callable[[int], str]) -> None:
        """Colour the last answer's tokens by divergence from the base (``decode`` names alternatives)."""
        self.divergence = tokens
        self.decode = decode
        more = sum(token.delta > 0 for token in tokens)
        mean = sum(token.delta for token in tokens) / max(1, len(tokens))
        self.divergence_note.setText(
            f"vs base: mean Δ log p {mean:+.2f} nats; {more} of {len(tokens)} tokens more likely (green)"
        )
        self.divergence_note.setVisible(self.mode == TOKENS)
        if self.mode == TOKENS:
            self.redraw()

    def set_mode(self, mode: str) -> None:
        if mode not in (MARKDOWN, PLAIN, TOKENS):
            raise ValueError(f"unknown view {mode!r}")
        self.mode = mode
        self.divergence_note.setVisible(mode == TOKENS and self.divergence is not None)
        self.redraw()

    # ---------------------------------------------------------------- drawing

    def redraw(self) -> None:
        """Draw the conversation: earlier turns as Markdown, the last answer in the chosen view."""
        self._render_timer.stop()
        bar = self.view.verticalScrollBar()
        at_end = bar.value() >= bar.maximum() - 40
        document = self.view.document()
        document.clear()
        cursor = QTextCursor(document)
        for user, answer in self.history:
            self._insert_user(cursor, user)
            cursor.insertMarkdown(answer)
            cursor.movePosition(QTextCursor.MoveOperation.End)
            cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
        if self.history:
            self._insert_user(cursor, self.user_text)
        self.answer_start = cursor.position()
        if self.mode == TOKENS and self.divergence is not None:
            for token in self.divergence:
                char_format = QTextCharFormat()
                char_format.setBackground(divergence_color(token.delta))
                char_format.setToolTip(divergence_tooltip(token, self.decode))
                cursor.insertText(token.text, char_format)
        elif self.mode in (PLAIN, TOKENS):
            cut = len(self.text) if self.diverges_at is None else self.diverges_at
            cursor.insertText(self.text[:cut], QTextCharFormat())
            highlighted = QTextCharFormat()
            highlighted.setBackground(HIGHLIGHT)
            cursor.insertText(self.text[cut:], highlighted)
        else:
            cursor.insertMarkdown(self.text)
        if at_end:
            bar.setValue(bar.maximum())

    def answer_format_at(self, index: int) -> QTextCharFormat:
        """The character format of the last answer's character ``index`` (for tests and tooltips)."""
        cursor = QTextCursor(self.view.document())
        cursor.setPosition(self.answer_start + utf16_offset(self.text, index) + 1)
        return cursor.charFormat()

    @staticmethod
    def _insert_user(cursor: QTextCursor, text: str) -> None:
        """The user's turn as its own shaded block; the answer after it starts a plain block."""
        block = QTextBlockFormat()
        block.setBackground(USER_BACKGROUND)
        block.setTopMargin(8)
        block.setBottomMargin(4)
        cursor.setBlockFormat(block)
        bold = QTextCharFormat()
        bold.setFontWeight(QFont.Weight.Bold)
        cursor.insertText("You: ", bold)
        cursor.insertText(text, QTextCharFormat())
        cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())

    # ---------------------------------------------------------------- header

    def show_overrides(self, overrides: ColumnOverrides) -> None:
        """Name this column's own settings in its header (hidden when it takes the shared ones)."""
        parts = []
        if overrides.temperature is not None:
            parts.append(f"T {overrides.temperature:g}")
        if overrides.max_tokens is not None:
            parts.append(f"max {overrides.max_tokens}")
        if overrides.stop is not None:
            parts.append(f"{len(overrides.stop)} stop")
        if overrides.seed is not None:
            parts.append(f"seed {overrides.seed}")
        self.overrides.setText("own: " + " · ".join(parts))
        self.overrides.setVisible(bool(parts))

    def _show_stats(self) -> None:
        rate = "-" if self.tokens_per_second is None else f"{self.tokens_per_second:.1f} tok/s"
        parts = [f"{self.tokens} tok", rate, f"TTFT {format_seconds(self.ttft_s)}"]
        if self.queue_s is not None:
            parts.append(f"queued {format_seconds(self.queue_s)}")
        if self.done:
            parts.append(self.finish_reason or "done")
        self.stats.setText(" · ".join(parts))

    def _elide_title(self) -> None:
        suffix = " (no adapter)" if self.reference else ""
        on = f" · {self.base}" if self.base and self.base != self.name else ""
        width = max(60, self.title.width())
        bold = self.title.font()
        bold.setBold(True)
        shown = QFontMetrics(bold).elidedText(self.name + suffix + on, Qt.TextElideMode.ElideMiddle, width)
        self.title.setText(f"<b>{html.escape(shown)}</b>")

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._elide_title()
