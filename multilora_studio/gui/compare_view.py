"""Compare view: a chat with any number of adapters and the base, one batched run per turn, N columns.

The chat, its sends, edits, reruns, divergence and exports are ``workflows.compare_session``'s; this
view binds widgets to it (one control group each: ``compare_inputs``, ``compare_ticks``,
``compare_actions``; a ``compare_column`` per answer) and runs each planned send as a
``CompareRun`` (one ``submit_many`` per base model: with several bases, columns may come from
different bases). Each run is recorded (``run_records.py``) in the history, from which it can be
rerun; exports carry the same record.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QApplication,
    QFileDialog,
    QFormLayout,
    QGridLayout,
    QHBoxLayout,
    QScrollArea,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from multilora_studio.gui.compare_actions import RunControls, TurnControls
from multilora_studio.gui.compare_chat import Conversation
from multilora_studio.gui.compare_column import CompareColumn
from multilora_studio.gui.compare_export import Comparison
from multilora_studio.gui.compare_history import RunHistoryDialog
from multilora_studio.gui.compare_inputs import MessageControls, SamplingControls
from multilora_studio.gui.compare_run import CompareRun
from multilora_studio.gui.compare_settings import ColumnSettingsDialog
from multilora_studio.gui.compare_ticks import AdapterTicks
from multilora_studio.gui.engine_host import EngineHost
from multilora_studio.gui.preferences import Preferences
from multilora_studio.gui.tasks import TaskRunner
from multilora_studio.gui.widgets import MessageBanner
from multilora_studio.gui.workflows.compare_divergence import Scored
from multilora_studio.gui.workflows.compare_record import Sending
from multilora_studio.gui.workflows.compare_session import COLUMNS, CompareSession
from multilora_studio.run_records import ColumnOverrides, RunHistory, RunRecord


class CompareView(QWidget):
    """See the module docstring; ``runFinished`` fires when every column of a run has ended,
    ``divergenceFinished`` when the token divergences of the last run are shown."""

    runFinished = Signal()
    divergenceFinished = Signal()

    def __init__(
        self, host: EngineHost, parent: QWidget | None = None, history: RunHistory | None = None
    ) -> None:
        super().__init__(parent)
        self.host = host
        self.session = CompareSession(lambda: host.pool, host.registry, history)
        self.tasks = TaskRunner(self)
        self.run: CompareRun | None = None
        self.columns: list[CompareColumn] = []
        self.banner = MessageBanner()
        self.message = MessageControls(self.session.inputs)
        self.sampling = SamplingControls(self.session.inputs)
        self.ticks = AdapterTicks(self.session)
        self.chat = TurnControls(self.session)
        self.controls = RunControls(self.session)
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.setChildrenCollapsible(False)
        self._name_widgets()
        self._connect()
        self._lay_out()

    def _name_widgets(self) -> None:
        """The controls' widgets by the names the window's drivers and tests use."""
        message, sampling, ticks, controls = self.message, self.sampling, self.ticks, self.controls
        self.system, self.prompt, self.raw = message.system, message.prompt, message.raw
        self.max_tokens, self.temperature, self.top_p = (
            sampling.max_tokens,
            sampling.temperature,
            sampling.top_p,
        )
        self.seed, self.stop_strings, self.ignore_eos = sampling.seed, sampling.stop, sampling.ignore_eos
        self.view_mode = sampling.view
        self.adapters, self.base_picker, self.slot_warning = (
            ticks.adapters,
            ticks.base_picker,
            ticks.slot_warning,
        )
        self.turns = self.chat.turns
        self.run_button, self.follow_button = controls.run_button, controls.follow_button
        self.stop_button, self.summary = controls.stop_button, controls.summary

    def _connect(self) -> None:
        session, controls = self.session, self.controls
        session.told.connect(
            lambda text, kind: self.banner.show_message(text, kind) if text else self.banner.clear()
        )
        session.changed.connect(lambda what: self._show_columns() if what == COLUMNS else None)
        session.inputs.changed.connect(lambda what: self._view_changed() if what == "view" else None)
        self.ticks.settingsRequested.connect(self.open_column_settings)
        self.chat.edit_button.clicked.connect(lambda: self.edit_turn(self.turns.currentRow()))
        self.chat.new_chat_button.clicked.connect(self.new_chat)
        controls.run_button.clicked.connect(self.start)
        controls.follow_button.clicked.connect(self.follow_up)
        controls.cancel_edit_button.clicked.connect(session.cancel_edit)
        controls.stop_button.clicked.connect(self.stop)
        controls.history_button.clicked.connect(self.open_history)
        controls.copy_button.clicked.connect(self.copy_markdown)
        controls.markdown_button.clicked.connect(lambda: self._save("Markdown (*.md)", ".md"))
        controls.json_button.clicked.connect(lambda: self._save("JSON (*.json)", ".json"))
        for keys in ("Ctrl+Shift+Return", "Ctrl+Shift+Enter"):
            shortcut = QShortcut(QKeySequence(keys), self, self.follow_up)
            shortcut.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        self.host.adaptersChanged.connect(session.choices.relist)
        self.host.stateChanged.connect(lambda state: session.choices.relist())

    def _lay_out(self) -> None:
        prompt_box = QVBoxLayout()
        self.message.lay_out(prompt_box)
        self.chat.lay_out(prompt_box)
        sampling = QFormLayout()
        self.sampling.lay_out(sampling)
        top = QHBoxLayout()
        top.addLayout(prompt_box, 3)
        top.addWidget(self.ticks, 2)
        top.addLayout(sampling, 2)
        buttons = QHBoxLayout()
        self.controls.lay_out(buttons)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(self.splitter)
        columns_area = QWidget()
        overlay = QGridLayout(columns_area)  # the banner lies over the columns' top: nothing above it moves
        overlay.setContentsMargins(0, 0, 0, 0)
        overlay.addWidget(scroll, 0, 0)
        overlay.addWidget(self.banner, 0, 0, Qt.AlignmentFlag.AlignTop)
        controls = QWidget()
        controls_layout = QVBoxLayout(controls)
        controls_layout.setContentsMargins(0, 0, 0, 0)
        controls_layout.addLayout(top)
        controls_layout.addLayout(buttons)
        vertical = QSplitter(Qt.Orientation.Vertical)
        vertical.addWidget(controls)
        vertical.addWidget(columns_area)
        vertical.setStretchFactor(1, 3)
        vertical.setSizes([330, 490])  # the columns get most of the height
        QVBoxLayout(self).addWidget(vertical, 1)
        self.banner.setAutoFillBackground(True)

    # ---------------------------------------------------------------- the session's state

    @property
    def running(self) -> bool:
        return self.run is not None

    @property
    def conversation(self) -> Conversation | None:
        return self.session.conversation

    @property
    def editing(self) -> int | None:
        return self.session.editing

    @property
    def column_bases(self) -> list[str]:
        return self.session.column_bases

    @property
    def comparison(self) -> Comparison | None:
        return self.session.comparison

    @property
    def divergence_busy(self) -> bool:
        return self.session.divergence_busy

    @property
    def history(self) -> RunHistory:
        return self.session.history

    @history.setter
    def history(self, history: RunHistory) -> None:
        self.session.history = history

    # ---------------------------------------------------------------- choices

    def pick_base(self, base: str | None) -> None:
        """List the adapters of ``base`` only (None: of every base)."""
        self.session.choices.pick_base(base)

    def checked_names(self) -> list[str]:
        return self.session.choices.ticked()

    def set_checked(self, names: list[str]) -> None:
        self.session.choices.tick(names)

    def tick_all(self, checked: bool) -> None:
        self.session.choices.tick_all(checked)

    def sweep_strength(self, adapter: str) -> None:
        """Tick ``adapter``'s base and ``adapter`` at every sweep strength (columns "name x0.25", ...)."""
        self.session.choices.sweep(adapter)

    def column_overrides(self, name: str) -> ColumnOverrides:
        return self.session.choices.own_settings(name)

    def set_column_overrides(self, name: str, overrides: ColumnOverrides) -> None:
        """Give column ``name`` its own settings (from its next send on)."""
        self.session.set_column_overrides(name, overrides)

    def open_column_settings(self, name: str) -> ColumnSettingsDialog:
        dialog = ColumnSettingsDialog(name, self.column_overrides(name), self)
        dialog.changed.connect(self.set_column_overrides)
        dialog.finished.connect(dialog.deleteLater)
        dialog.open()
        return dialog

    # ---------------------------------------------------------------- sending

    def start(self) -> bool:
        """Run the message as a new chat with the ticked adapters (or resend the turn being edited)."""
        return self._launch(self.session.start())

    def follow_up(self) -> bool:
        """Send the message as the next turn to every column of the chat, each with its own history."""
        return self._launch(self.session.follow_up())

    def edit_turn(self, turn: int) -> None:
        """Put user turn ``turn`` (0-based) in the message box; Run resends the chat from there."""
        if self.session.edit_turn(turn):
            self.prompt.setFocus()

    def new_chat(self) -> None:
        """Forget the chat (its runs stay in the history)."""
        self.session.new_chat()

    def stop(self) -> None:
        if self.run is not None:
            self.run.stop()
            self.session.summary = "stopping…"

    def _launch(self, sending: Sending | None) -> bool:
        """Run ``sending`` (None: nothing to run)."""
        if sending is None:
            return False
        run = CompareRun(sending.pool, sending.requests, side_work=self.session.side_work(sending))
        run.updated.connect(self._updated)
        run.columnFinished.connect(self._updated)
        run.finished.connect(self._finished)
        run.failed.connect(self._failed)
        self.run = run
        run.start()
        return True

    def _show_columns(self) -> None:
        """A column widget for each of the session's answers."""
        for column in self.columns:
            column.release()
            column.setParent(None)
            column.deleteLater()
        self.columns = []
        for answer in self.session.answers:
            column = CompareColumn(answer)
            column.settingsRequested.connect(self.open_column_settings)
            column.set_mode(self.session.inputs.view)
            self.columns.append(column)
            self.splitter.addWidget(column)

    def _updated(self, index: int) -> None:
        if self.run is not None:
            self.session.apply(index, self.run.take(index))

    def _finished(self) -> None:
        run = self.run
        if run is None or not self.session.running:
            return
        updates = [run.take(index) for index in range(len(self.session.answers))]
        self.session.finish(updates, run.engine_records, run.side_result or {})
        self.run = None
        if self.session.divergence_due():
            self.compute_divergence()
        self.runFinished.emit()

    def _failed(self, message: str) -> None:
        self.run = None
        self.session.fail(message)
        self.runFinished.emit()

    # ---------------------------------------------------------------- divergence

    def _view_changed(self) -> None:
        for column in self.columns:
            column.set_mode(self.session.inputs.view)
        if self.session.divergence_due():
            self.compute_divergence()

    def compute_divergence(self) -> bool:
        """Score the last answers under their adapters and their bases (one batch per base, each
        base leased, off the GUI thread)."""
        scoring = self.session.score_divergence()
        if scoring is None:
            return False

        def shown(scored: Scored) -> None:
            if self.session.show_divergence(scoring, scored):
                self.divergenceFinished.emit()

        def failed(message: str) -> None:
            self.session.divergence_failed(scoring, message)
            self.divergenceFinished.emit()

        self.tasks.run("divergence", lambda task: scoring.score(self.host.lease), shown, failed)
        return True

    # ---------------------------------------------------------------- history

    def open_history(self) -> RunHistoryDialog:
        dialog = RunHistoryDialog(self.session.history, self)
        dialog.rerunRequested.connect(self.rerun)
        dialog.finished.connect(dialog.deleteLater)
        dialog.open()
        return dialog

    def rerun(self, record: RunRecord) -> bool:
        """Restore a past run's inputs and run it again with the prompts and settings it recorded,
        each column on the base it ran on (an adapter: the base that serves it now)."""
        return self._launch(self.session.rerun(record))

    # ---------------------------------------------------------------- export

    def copy_markdown(self) -> None:
        text = self.session.copy_markdown()
        if text is not None:
            QApplication.clipboard().setText(text)

    def export(self, path: str | Path) -> Path:
        """Write the last comparison as Markdown (.md) or JSON (.json)."""
        return self.session.export(path)

    def _save(self, kind: str, suffix: str) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export the comparison", f"comparison{suffix}", kind)
        if path:
            self.session.save_export(path, suffix)

    # ---------------------------------------------------------------- remembered choices

    def saved_widgets(self) -> list[QWidget]:
        """The inputs ``save_state`` records (the window saves again when any of them changes)."""
        return [*self.message.widgets(), self.adapters, *self.sampling.widgets()]

    def save_state(self, prefs: Preferences) -> None:
        self.session.save_state(prefs)

    def restore_state(self, prefs: Preferences) -> None:
        self.session.restore_state(prefs)
