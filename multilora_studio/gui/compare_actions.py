"""The Compare view's chat and run controls, bound to ``workflows.compare_session``: the turns with
*Edit turn* and *New chat*; Run, Follow up, Cancel edit, Stop, the summary line, History and the exports."""

from __future__ import annotations

from PySide6.QtWidgets import QHBoxLayout, QLabel, QListWidget, QPushButton, QSizePolicy, QVBoxLayout

from multilora_studio.gui.workflows.compare_session import CHAT, CompareSession

RUN = "Run  (Ctrl+Enter)"


class TurnControls:
    """The chat's user turns; the view connects *Edit turn* and *New chat*."""

    def __init__(self, session: CompareSession) -> None:
        self.session = session
        self.turns = QListWidget()
        self.turns.setToolTip("The chat's user turns; pick one and Edit to change it and resend from there")
        self.turns.setMaximumHeight(90)
        self.edit_button = QPushButton("Edit turn")
        self.new_chat_button = QPushButton("New chat")
        session.changed.connect(self._changed)
        self._changed(CHAT)

    def _changed(self, what: str) -> None:
        if what != CHAT:
            return
        labels = self.session.turn_labels()
        if [self.turns.item(i).text() for i in range(self.turns.count())] != labels:
            self.turns.clear()
            self.turns.addItems(labels)
        self.edit_button.setEnabled(self.session.can_edit)
        self.new_chat_button.setEnabled(not self.session.running)

    def lay_out(self, box: QVBoxLayout) -> None:
        row = QHBoxLayout()
        row.addWidget(self.turns, 1)
        buttons = QVBoxLayout()
        buttons.addWidget(self.edit_button)
        buttons.addWidget(self.new_chat_button)
        buttons.addStretch(1)
        row.addLayout(buttons)
        box.addLayout(row)


class RunControls:
    """The buttons of a send and of the last comparison, and the summary line; the view connects them."""

    def __init__(self, session: CompareSession) -> None:
        self.session = session
        self.run_button = QPushButton(RUN)
        self.run_button.setToolTip("A new chat: the message to every ticked adapter")
        self.follow_button = QPushButton("Follow up  (Ctrl+Shift+Enter)")
        self.follow_button.setToolTip("The message as the next turn of every column's own chat")
        self.cancel_edit_button = QPushButton("Cancel edit")
        self.stop_button = QPushButton("Stop  (Esc)")
        self.history_button = QPushButton("History…")
        self.copy_button = QPushButton("Copy Markdown")
        self.markdown_button = QPushButton("Save Markdown…")
        self.json_button = QPushButton("Save JSON…")
        self.summary = QLabel()
        self.summary.setSizePolicy(
            QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred
        )  # never widens the bar
        session.changed.connect(self._changed)
        for what in (CHAT, "editing"):
            self._changed(what)

    def _changed(self, what: str) -> None:
        session = self.session
        if what == CHAT:
            self.run_button.setEnabled(not session.running)
            self.stop_button.setEnabled(session.running)
            self.follow_button.setEnabled(session.can_follow_up)
            self.history_button.setEnabled(not session.running)
            for button in (self.copy_button, self.markdown_button, self.json_button):
                button.setEnabled(session.can_export)
        elif what == "editing":
            editing = session.editing
            self.run_button.setText(
                RUN if editing is None else f"Resend from turn {editing + 1}  (Ctrl+Enter)"
            )
            self.cancel_edit_button.setVisible(editing is not None)
        elif what == "summary":
            self.summary.setText(session.summary)

    def lay_out(self, row: QHBoxLayout) -> None:
        for button in (self.run_button, self.follow_button, self.cancel_edit_button, self.stop_button):
            row.addWidget(button)
        row.addWidget(self.summary, 1)
        for button in (self.history_button, self.copy_button, self.markdown_button, self.json_button):
            row.addWidget(button)
