"""One column of the Compare view: an adapter's conversation, its numbers and where it leaves the base.

The last answer streams in; it shows as Markdown, as plain text with the part after the first
difference from the base highlighted, or as tokens coloured by their divergence from the base.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from typing import Any

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
from multilora_studio.gui.diff import utf16_offset
from multilora_studio.gui.workflows.compare_answers import (
    COUNTED,
    DEPARTED,
    DIVERGED,
    FAILED,
    FINISHED,
    GREW,
    OWN_SETTINGS,
    QUIET,
    SCORED,
    TURN,
    AnswerState,
    overrides_label,
)
from multilora_studio.gui.workflows.compare_inputs import MARKDOWN, PLAIN, TOKENS
from multilora_studio.gui.workflows.compare_requests import ColumnUpdate

HIGHLIGHT = QColor(255, 179, 0, 90)  # amber, readable on light and dark backgrounds
MORE_LIKELY = (46, 160, 67)  # green: the adapter makes the token more likely than the base does
LESS_LIKELY = (220, 50, 47)  # red: less likely
DIVERGENCE_SCALE = 4.0  # nats of |delta| that get the strongest colour
RENDER_MS = 40  # a streaming answer is drawn again at most this often
USER_BACKGROUND = QColor(127, 127, 127, 40)  # the user's turns: grey on light and dark themes
TONES = {QUIET: "color: palette(placeholder-text);", FAILED: "color: #c62828;", DEPARTED: "color: #e65100;"}


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


class Shown:
    """An attribute of the column's ``AnswerState``, read through the widget."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, column: CompareColumn, owner: type | None = None) -> Any:
        return getattr(column.state, self.name)


class CompareColumn(QFrame):
    """Shows one column's ``AnswerState`` (``answer``; a name: a new one of that name) and follows its
    changes: the conversation, ``text`` its last answer as it streams, the numbers, the difference
    from the base. ``settingsRequested(name)``: its ⚙ asks for its own settings."""

    settingsRequested = Signal(str)
    name, base, reference, text, history, user_text = Shown(), Shown(), Shown(), Shown(), Shown(), Shown()
    tokens, ttft_s, queue_s, tokens_per_second = Shown(), Shown(), Shown(), Shown()
    prompt_tokens, cached_tokens = Shown(), Shown()
    finish_reason, error, output, done = Shown(), Shown(), Shown(), Shown()
    diverges_at, agreed, divergence, decode = Shown(), Shown(), Shown(), Shown()

    def __init__(self, answer: AnswerState | str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = answer if isinstance(answer, AnswerState) else AnswerState(answer)
        self.mode = MARKDOWN
        self.answer_start = 0  # where the last answer begins in the document
        self.tone = QUIET  # how the difference line reads now
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setMinimumWidth(220)
        self.title = QLabel()
        self.title.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.title.setToolTip(
            self.name
            + (" (the model without an adapter)" if self.reference else "")
            + (f" on base model {self.base}" if self.base else "")
        )
        self.settings_button = QToolButton()
        self.settings_button.setText("⚙")
        self.settings_button.setAutoRaise(True)
        self.settings_button.setToolTip(f"Settings of the {self.name} column (override the shared ones)")
        self.settings_button.clicked.connect(lambda: self.settingsRequested.emit(self.name))
        self.overrides, self.stats, self.difference, self.divergence_note = (QLabel() for _ in range(4))
        self.stats.setToolTip(
            "Generated tokens, tokens/s, time to first token, and the prompt's tokens: those cached "
            "came from the prefix cache (an earlier request with the same start and adapter), not computed"
        )
        self.divergence_note.setToolTip(
            "log p(token) under the adapter minus under the base: green more likely under the adapter, "
            "red less; hover a token for both models' top alternatives"
        )
        self.view = QTextBrowser()
        self.view.setOpenLinks(False)
        self._render_timer = QTimer(self)
        self._render_timer.setSingleShot(True)
        self._render_timer.setInterval(RENDER_MS)
        self._render_timer.timeout.connect(self.redraw)
        self._lay_out()
        self.state.changed.connect(self._changed)
        self._changed(OWN_SETTINGS)
        self._changed(TURN)

    def _lay_out(self) -> None:
        header = QHBoxLayout()
        header.addWidget(self.title, 1)
        header.addWidget(self.settings_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addLayout(header)
        for label in (self.overrides, self.stats, self.difference, self.divergence_note):
            label.setWordWrap(label is not self.overrides)
            label.setStyleSheet(TONES[QUIET])
            layout.addWidget(label)
        layout.addWidget(self.view, 1)
        self._elide_title()

    def release(self) -> None:
        """Stop following the state (the column leaves the view)."""
        self.state.changed.disconnect(self._changed)

    # ---------------------------------------------------------------- the state's changes

    def begin_turn(self, history: list[tuple[str, str]], user_text: str) -> None:
        self.state.begin_turn(history, user_text)

    def apply(self, update: ColumnUpdate) -> None:
        self.state.apply(update)

    def _changed(self, what: str) -> None:
        state = self.state
        if what == OWN_SETTINGS:
            label = overrides_label(state.overrides)
            self.overrides.setText("own: " + label)
            self.overrides.setVisible(bool(label))
            return
        if what == TURN:
            self.stats.setText("waiting…")
        elif what in (GREW, COUNTED, FINISHED):
            self.stats.setText(state.stats())
        self._show_difference()
        if what == SCORED:
            self.divergence_note.setText(state.divergence_summary())
        if what in (TURN, SCORED):
            self.divergence_note.setVisible(self.mode == TOKENS and state.divergence is not None)
        if what in (TURN, FINISHED) or (what, self.mode) in ((DIVERGED, PLAIN), (SCORED, TOKENS)):
            self.redraw()
        elif what == GREW and not self._render_timer.isActive():
            self._render_timer.start()

    def _show_difference(self) -> None:
        if self.difference.text() != self.state.difference:
            self.difference.setText(self.state.difference)
        if self.tone != self.state.difference_tone:
            self.tone = self.state.difference_tone
            self.difference.setStyleSheet(TONES[self.tone])

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
