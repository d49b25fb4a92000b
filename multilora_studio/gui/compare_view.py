"""Compare view: a chat with any number of adapters and the base, one batched run per turn, N columns.

Each send goes to every column at once (one ``submit_many`` per base model: with several bases,
columns may come from different bases, ``compare_bases.py``); a column's history holds its own
adapter's answers. Each run is recorded (``run_records.py``) in the history, from which it can be
rerun; exports carry the same record.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QApplication,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from multilora_studio.deploy import BasePool
from multilora_studio.divergence import DivergenceRequest, TokenDivergence, score_divergence
from multilora_studio.engine import ServingEngine
from multilora_studio.gui.compare_bases import base_column, column_base, column_entries, slot_shortfall
from multilora_studio.gui.compare_chat import Conversation
from multilora_studio.gui.compare_column import TOKENS, CompareColumn
from multilora_studio.gui.compare_export import Comparison, to_json, to_markdown
from multilora_studio.gui.compare_history import RunHistoryDialog
from multilora_studio.gui.compare_inputs import CompareInputs
from multilora_studio.gui.compare_run import ColumnRequest, CompareRun
from multilora_studio.gui.compare_settings import ColumnSettingsDialog
from multilora_studio.gui.diff import first_difference
from multilora_studio.gui.engine_host import EngineHost
from multilora_studio.gui.preferences import Preferences
from multilora_studio.gui.tasks import Task, TaskRunner
from multilora_studio.gui.widgets import MessageBanner
from multilora_studio.run_records import (
    BASE,
    SWEEP_STRENGTHS,
    AdapterDigests,
    ColumnOutput,
    ColumnOverrides,
    ColumnRun,
    RunHistory,
    RunRecord,
    RunSettings,
    column_choice,
    strength_column,
)

ALL_BASES = "All bases"


@dataclass
class _Sending:
    """A send in flight: the chat before it (restored if it fails) and what each column sent."""

    previous: Conversation | None
    conversation: Conversation
    shared: RunSettings
    overrides: list[ColumnOverrides]
    settings: list[RunSettings]


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
        self.history = history or RunHistory()
        self.digests = AdapterDigests()
        self.tasks = TaskRunner(self)
        self.run: CompareRun | None = None
        self.columns: list[CompareColumn] = []
        self.column_bases: list[str] = []  # the base model each column runs on
        self.conversation: Conversation | None = None
        self.comparison: Comparison | None = None
        self.editing: int | None = None  # the user turn being edited, if any
        self.divergence_busy = False
        self._sending: _Sending | None = None
        self._wanted: set[str] = {BASE}
        self._strengths: set[str] = set()  # columns of adapters at other strengths ("name x0.5")
        self.banner = MessageBanner()

        self.inputs = inputs = CompareInputs()
        self.system, self.prompt, self.raw = inputs.system, inputs.prompt, inputs.raw
        self.adapters, self.max_tokens, self.temperature = (
            inputs.adapters,
            inputs.max_tokens,
            inputs.temperature,
        )
        self.top_p, self.seed, self.stop_strings = inputs.top_p, inputs.seed, inputs.stop
        self.ignore_eos, self.view_mode = inputs.ignore_eos, inputs.view
        self.adapters.itemChanged.connect(self._ticks_changed)
        self.view_mode.currentIndexChanged.connect(lambda *_: self._view_changed())
        every, none = QPushButton("All"), QPushButton("None")
        every.clicked.connect(lambda: self.tick_all(True))
        none.clicked.connect(lambda: self.tick_all(False))
        self.column_settings_button = QPushButton("⚙")
        self.column_settings_button.setToolTip("Settings of the selected adapter's column")
        self.column_settings_button.clicked.connect(self._settings_of_selected)
        self.sweep_button = QPushButton("Strength sweep")
        self.sweep_button.setToolTip(
            "The selected adapter at strengths "
            + ", ".join(f"{s:g}" for s in SWEEP_STRENGTHS)
            + " beside the base, in one batch"
        )
        self.sweep_button.clicked.connect(self._sweep_selected)
        self.base_picker = QComboBox()
        self.base_picker.setToolTip("List the adapters of every base model, or of one")
        self.base_picker.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.base_picker.setMinimumWidth(self.base_picker.fontMetrics().horizontalAdvance(ALL_BASES) + 48)
        self.base_picker.currentIndexChanged.connect(lambda *_: self.refresh_adapters())
        self.base_picker.hide()
        self.slot_warning = QLabel()
        self.slot_warning.setWordWrap(True)
        self.slot_warning.setStyleSheet("color: #b26a00;")
        self.slot_warning.hide()
        self.turns = QListWidget()
        self.turns.setToolTip("The chat's user turns; pick one and Edit to change it and resend from there")
        self.turns.setMaximumHeight(90)
        self.edit_button = QPushButton("Edit turn")
        self.edit_button.clicked.connect(lambda: self.edit_turn(self.turns.currentRow()))
        self.new_chat_button = QPushButton("New chat")
        self.new_chat_button.clicked.connect(self.new_chat)
        self.run_button = QPushButton("Run  (Ctrl+Enter)")
        self.run_button.setToolTip("A new chat: the message to every ticked adapter")
        self.follow_button = QPushButton("Follow up  (Ctrl+Shift+Enter)")
        self.follow_button.setToolTip("The message as the next turn of every column's own chat")
        self.cancel_edit_button = QPushButton("Cancel edit")
        self.cancel_edit_button.hide()
        self.stop_button = QPushButton("Stop  (Esc)")
        self.stop_button.setEnabled(False)
        self.history_button = QPushButton("History…")
        self.copy_button = QPushButton("Copy Markdown")
        self.markdown_button = QPushButton("Save Markdown…")
        self.json_button = QPushButton("Save JSON…")
        for button in (
            self.copy_button,
            self.markdown_button,
            self.json_button,
            self.follow_button,
            self.edit_button,
        ):
            button.setEnabled(False)
        self.run_button.clicked.connect(self.start)
        self.follow_button.clicked.connect(self.follow_up)
        self.cancel_edit_button.clicked.connect(self.cancel_edit)
        self.stop_button.clicked.connect(self.stop)
        self.history_button.clicked.connect(self.open_history)
        self.copy_button.clicked.connect(self.copy_markdown)
        self.markdown_button.clicked.connect(lambda: self._save("Markdown (*.md)", ".md"))
        self.json_button.clicked.connect(lambda: self._save("JSON (*.json)", ".json"))
        self.summary = QLabel()
        self.summary.setSizePolicy(
            QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred
        )  # never widens the bar
        self._lay_out(every, none)
        for keys in ("Ctrl+Shift+Return", "Ctrl+Shift+Enter"):
            shortcut = QShortcut(QKeySequence(keys), self, self.follow_up)
            shortcut.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        host.adaptersChanged.connect(self.refresh_adapters)
        host.stateChanged.connect(lambda state: self.refresh_adapters())

    def _lay_out(self, every: QPushButton, none: QPushButton) -> None:
        inputs = self.inputs
        prompt_box = QVBoxLayout()
        prompt_box.addWidget(QLabel("<b>System prompt</b>"))
        prompt_box.addWidget(inputs.system)
        prompt_box.addWidget(QLabel("<b>Message</b>"))
        prompt_box.addWidget(inputs.prompt, 1)
        prompt_box.addWidget(inputs.raw)
        turns = QHBoxLayout()
        turns.addWidget(self.turns, 1)
        turn_buttons = QVBoxLayout()
        turn_buttons.addWidget(self.edit_button)
        turn_buttons.addWidget(self.new_chat_button)
        turn_buttons.addStretch(1)
        turns.addLayout(turn_buttons)
        prompt_box.addLayout(turns)
        adapter_box = QVBoxLayout()
        ticks = QHBoxLayout()
        ticks.addWidget(QLabel("<b>Adapters</b>"), 1)
        ticks.addWidget(self.base_picker)
        ticks.addWidget(every)
        ticks.addWidget(none)
        ticks.addWidget(self.column_settings_button)
        ticks.addWidget(self.sweep_button)
        adapter_box.addLayout(ticks)
        adapter_box.addWidget(inputs.adapters, 1)
        adapter_box.addWidget(self.slot_warning)
        sampling = QFormLayout()
        sampling.addRow("Max tokens", inputs.max_tokens)
        sampling.addRow("Temperature", inputs.temperature)
        sampling.addRow("Top p", inputs.top_p)
        sampling.addRow("Seed", inputs.seed)
        sampling.addRow("Stop strings", inputs.stop)
        sampling.addRow(inputs.ignore_eos)
        sampling.addRow("Show", inputs.view)
        top = QHBoxLayout()
        top.addLayout(prompt_box, 3)
        top.addLayout(adapter_box, 2)
        top.addLayout(sampling, 2)
        buttons = QHBoxLayout()
        for button in (self.run_button, self.follow_button, self.cancel_edit_button, self.stop_button):
            buttons.addWidget(button)
        buttons.addWidget(self.summary, 1)
        for button in (self.history_button, self.copy_button, self.markdown_button, self.json_button):
            buttons.addWidget(button)

        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.setChildrenCollapsible(False)
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
        layout = QVBoxLayout(self)
        layout.addWidget(vertical, 1)
        self.banner.setAutoFillBackground(True)

    # ---------------------------------------------------------------- choices

    def refresh_adapters(self) -> None:
        """List each base model (``base`` for the first) and every adapter it serves, of the
        base picked (or of all), ticked as the person left them."""
        pool = self.host.pool
        self._refresh_picker(pool)
        picked = self.base_picker.currentData()
        bases = [] if pool is None else [picked] if picked in pool.names else pool.names
        entries = column_entries(pool, bases, self._strengths) if pool is not None else []
        self.adapters.blockSignals(True)
        self.adapters.clear()
        for name, label in entries:
            self.adapters.addItem(self.inputs.list_item(name, label, name in self._wanted))
        self.adapters.blockSignals(False)
        self._update_slot_warning()

    def _refresh_picker(self, pool: BasePool | None) -> None:
        """The base picker lists every base (shown only when there are several)."""
        names = pool.names if pool is not None else []
        listed = [self.base_picker.itemData(i) for i in range(1, self.base_picker.count())]
        self.base_picker.setVisible(len(names) > 1)
        if listed == names:
            return
        picked = self.base_picker.currentData()
        self.base_picker.blockSignals(True)
        self.base_picker.clear()
        self.base_picker.addItem(ALL_BASES, None)
        for name in names:
            self.base_picker.addItem(name, name)
        self.base_picker.setCurrentIndex(max(0, self.base_picker.findData(picked)))
        self.base_picker.blockSignals(False)

    def pick_base(self, base: str | None) -> None:
        """List the adapters of ``base`` only (None: of every base)."""
        self.base_picker.setCurrentIndex(max(0, self.base_picker.findData(base)))

    def _ticks_changed(self) -> None:
        listed = {self.adapters.item(i).data(Qt.ItemDataRole.UserRole) for i in range(self.adapters.count())}
        self._wanted = (self._wanted - listed) | set(self.checked_names())
        self._update_slot_warning()

    def checked_names(self) -> list[str]:
        return [
            self.adapters.item(i).data(Qt.ItemDataRole.UserRole)
            for i in range(self.adapters.count())
            if self.adapters.item(i).checkState() == Qt.CheckState.Checked
        ]

    def set_checked(self, names: list[str]) -> None:
        self._wanted = set(names)
        self.adapters.blockSignals(True)
        for i in range(self.adapters.count()):
            item = self.adapters.item(i)
            name = item.data(Qt.ItemDataRole.UserRole)
            item.setCheckState(Qt.CheckState.Checked if name in self._wanted else Qt.CheckState.Unchecked)
        self.adapters.blockSignals(False)
        self.adapters.viewport().update()
        self._update_slot_warning()

    def _sweep_selected(self) -> None:
        """Sweep the selected adapter's strength (or the first ticked adapter's)."""
        pool = self.host.pool
        bases = set(pool.names) if pool is not None else set()
        item = self.adapters.currentItem()
        selected = item.data(Qt.ItemDataRole.UserRole) if item is not None else BASE
        choice = column_choice(selected)[0] if selected not in bases else None
        ticked = [
            column_choice(name)[0] for name in self.checked_names() if name != BASE and name not in bases
        ]
        adapter = choice or (ticked[0] if ticked else None)
        if adapter is None:
            self.banner.show_message("Select an adapter to sweep its strength.", "warning")
            return
        self.sweep_strength(adapter)

    def sweep_strength(self, adapter: str) -> None:
        """Tick ``adapter``'s base and ``adapter`` at every SWEEP_STRENGTHS (columns "name x0.25", ...)."""
        columns = [strength_column(adapter, scale) for scale in SWEEP_STRENGTHS]
        pool = self.host.pool
        base = column_base(pool, adapter) if pool is not None else None
        self._choose([base_column(pool, base) if pool is not None and base is not None else BASE, *columns])

    def tick_all(self, checked: bool) -> None:
        state = Qt.CheckState.Checked if checked else Qt.CheckState.Unchecked
        for i in range(self.adapters.count()):
            self.adapters.item(i).setCheckState(state)

    def _update_slot_warning(self) -> None:
        """Warn when a base's ticked adapters outnumber its GPU slots: they cannot all run in one batch."""
        pool = self.host.pool
        short = slot_shortfall(pool, self.checked_names()) if pool is not None else []
        if not short:
            self.slot_warning.hide()
            return
        base, ticked, slots = short[0]
        where = f"the engine of {base}" if len(pool.names) > 1 else "the engine"  # type: ignore[union-attr]
        self.slot_warning.setText(
            f"{ticked} adapters ticked but {where} has {slots} GPU slots (max_loras): "
            f"{ticked - slots} wait until a slot frees, so the columns do not all run in one "
            "batch and their numbers are not comparable (see each column's queue time). "
            "Tick fewer or raise max_loras in Settings."
        )
        self.slot_warning.show()

    # ---------------------------------------------------------------- column settings

    def column_overrides(self, name: str) -> ColumnOverrides:
        return self.inputs.overrides.get(name, ColumnOverrides())

    def set_column_overrides(self, name: str, overrides: ColumnOverrides) -> None:
        """Give column ``name`` its own settings (from its next send on)."""
        self.inputs.overrides[name] = overrides
        for column in self.columns:
            if column.name == name:
                column.show_overrides(overrides)
        self.refresh_adapters()

    def open_column_settings(self, name: str) -> ColumnSettingsDialog:
        dialog = ColumnSettingsDialog(name, self.column_overrides(name), self)
        dialog.changed.connect(self.set_column_overrides)
        dialog.finished.connect(dialog.deleteLater)
        dialog.open()
        return dialog

    def _settings_of_selected(self) -> None:
        item = self.adapters.currentItem()
        if item is None:
            self.banner.show_message("Select an adapter in the list first.", "info")
            return
        self.open_column_settings(item.data(Qt.ItemDataRole.UserRole))

    # ---------------------------------------------------------------- sending

    @property
    def running(self) -> bool:
        return self.run is not None

    def start(self) -> bool:
        """Run the message as a new chat with the ticked adapters (or resend the turn being edited)."""
        if self.editing is not None:
            return self._resend(self.editing)
        names = self.checked_names()
        if not names:
            self.banner.show_message("Tick at least one adapter or the base model.", "warning")
            return False
        conversation = Conversation(names, self.system.toPlainText().strip(), self.raw.isChecked())
        return self._send(conversation, previous=self.conversation, new_columns=True)

    def follow_up(self) -> bool:
        """Send the message as the next turn to every column of the chat, each with its own history."""
        if self.conversation is None or self.conversation.turns == 0:
            return self.start()
        if self.conversation.raw:
            self.banner.show_message(
                "A raw prompt has no turns: untick Raw prompt and Run a new chat.", "warning"
            )
            return False
        return self._send(copy.deepcopy(self.conversation), previous=self.conversation, new_columns=False)

    def edit_turn(self, turn: int) -> None:
        """Put user turn ``turn`` (0-based) in the message box; Run resends the chat from there."""
        if self.conversation is None or not 0 <= turn < self.conversation.turns:
            self.banner.show_message("Pick a turn of the chat to edit.", "info")
            return
        self.editing = turn
        self.prompt.setPlainText(self.conversation.user_turns[turn])
        self.run_button.setText(f"Resend from turn {turn + 1}  (Ctrl+Enter)")
        self.cancel_edit_button.show()
        self.prompt.setFocus()

    def cancel_edit(self) -> None:
        self.editing = None
        self.run_button.setText("Run  (Ctrl+Enter)")
        self.cancel_edit_button.hide()

    def new_chat(self) -> None:
        """Forget the chat (its runs stay in the history)."""
        if self.run is not None:
            return
        self.cancel_edit()
        self.conversation = None
        self._clear_columns()
        self._show_turns()
        self.comparison = None
        self._set_running(False)
        self.summary.clear()

    def _resend(self, turn: int) -> bool:
        assert self.conversation is not None
        conversation = copy.deepcopy(self.conversation)
        conversation.cut(turn)
        return self._send(conversation, previous=self.conversation, new_columns=False)

    def _send(self, conversation: Conversation, previous: Conversation | None, new_columns: bool) -> bool:
        """Ask ``conversation`` the message box's text and run it; a problem shows in the banner."""
        if self.run is not None:
            return False
        pool = self.host.pool
        if pool is None:
            self.banner.show_message("The engine is not ready yet (see the status bar).", "warning")
            return False
        text = self.prompt.toPlainText().strip()
        if not text:
            self.banner.show_message("Type a prompt first.", "warning")
            return False
        try:
            shared = self.inputs.shared_settings()
            conversation.ask(text)
            overrides = [self.column_overrides(name) for name in conversation.names]
            settings = [shared.with_overrides(o) for o in overrides]
            requests = [
                ColumnRequest(name, conversation.prompt(i), s.sampling_params(), self._base_of(pool, name))
                for i, (name, s) in enumerate(zip(conversation.names, settings, strict=True))
            ]
        except ValueError as error:
            self.banner.show_message(str(error))
            return False
        sending = _Sending(previous, conversation, shared, overrides, settings)
        self._launch(pool, sending, requests, new_columns)
        return True

    @staticmethod
    def _base_of(pool: BasePool, name: str) -> str:
        base = column_base(pool, name)
        if base is None:
            raise ValueError(f"no base model serves {column_choice(name)[0]!r}; tick another adapter")
        return base

    def _launch(
        self, pool: BasePool, sending: _Sending, requests: list[ColumnRequest], new_columns: bool
    ) -> None:
        self.banner.clear()
        self.cancel_edit()
        conversation = sending.conversation
        self.conversation = conversation
        bases = [request.base for request in requests]
        if new_columns or [c.name for c in self.columns] != conversation.names or bases != self.column_bases:
            self._clear_columns()
            several = len(pool.names) > 1
            for request in requests:
                column = CompareColumn(
                    request.name, base=request.base if several else "", reference=request.adapter is None
                )
                column.settingsRequested.connect(self.open_column_settings)
                column.set_mode(self.inputs.view_mode)
                self.columns.append(column)
                self.splitter.addWidget(column)
            self.column_bases = bases
        for index, column in enumerate(self.columns):
            column.show_overrides(sending.overrides[index])
            column.begin_turn(self._history_of(conversation, index), conversation.user_turns[-1])
        self._show_turns()
        paths = {name: path for base in pool.names for name, path in pool.adapters_of(base).items()}
        names = [r.name for r in requests if r.adapter is not None and r.adapter in paths]
        run = CompareRun(pool, requests, side_work=lambda: self._identify(names, paths))
        run.updated.connect(self._updated)
        run.columnFinished.connect(self._updated)
        run.finished.connect(self._finished)
        run.failed.connect(self._failed)
        self.run = run
        self._sending = sending
        self.comparison = None
        self._set_running(True)
        turn = f"turn {conversation.turns}: " if conversation.turns > 1 else ""
        on = ", ".join(run.bases)
        batch = "one batch" if len(run.bases) == 1 else "one batch per base"
        self.summary.setText(f"{turn}{len(requests)} requests in {batch} on {on}…")
        run.start()

    def _identify(self, names: list[str], paths: dict[str, Path]) -> dict[str, tuple[str, str | None]]:
        """Each adapter's weights digest and library source (on the run's launch thread)."""
        found = {}
        for name in names:
            adapter = column_choice(name)[0]
            assert adapter is not None  # names holds adapter columns only
            record = self.host.registry.find(adapter)
            found[name] = (self.digests.of(paths[adapter]), None if record is None else record.source_label)
        return found

    @staticmethod
    def _history_of(conversation: Conversation, column: int) -> list[tuple[str, str]]:
        return list(zip(conversation.user_turns[:-1], conversation.answers[column], strict=False))

    def stop(self) -> None:
        if self.run is not None:
            self.run.stop()
            self.summary.setText("stopping…")

    def _updated(self, index: int) -> None:
        if self.run is None or index >= len(self.columns):
            return
        self.columns[index].apply(self.run.take(index))
        self._check_differences()

    def _check_differences(self) -> None:
        """Each adapter column against its own base's column without an adapter, when ticked."""
        references = {
            base: column
            for column, base in zip(self.columns, self.column_bases, strict=True)
            if column.reference
        }
        for column, on in zip(self.columns, self.column_bases, strict=True):
            base = references.get(on)
            if base is None or column is base or column.diverges_at is not None:
                continue
            index = first_difference(base.text, column.text, base.done, column.done, column.agreed)
            if index is not None:
                column.mark_divergence(index)
            else:
                column.agreed = min(len(base.text), len(column.text))
                if base.done and column.done:
                    column.mark_same()

    def _finished(self) -> None:
        run, sending = self.run, self._sending
        if run is None or sending is None:
            return
        for index in range(len(self.columns)):
            self.columns[index].apply(run.take(index))
        self._check_differences()
        for index, column in enumerate(self.columns):
            sending.conversation.answer(index, column.text)
        record = self._record(run, sending, run.side_result or {})
        self.comparison = (
            None
            if record is None
            else Comparison(record, {c.name: c.diverges_at for c in self.columns if not c.reference})
        )
        self.run = self._sending = None
        self._set_running(False)
        tokens = sum(c.tokens for c in self.columns)
        runs = (
            "one batched run" if len(run.bases) == 1 else f"one batched run on each of {len(run.bases)} bases"
        )
        self.summary.setText(f"{len(self.columns)} answers, {tokens} tokens in {runs}")
        try:
            if record is not None:
                self.history.add(record)
        except OSError as error:
            self.banner.show_message(f"The run could not be kept in the history: {error}", "warning")
        if self.inputs.view_mode == TOKENS:
            self.compute_divergence()
        self.runFinished.emit()

    def _record(
        self, run: CompareRun, sending: _Sending, identities: dict[str, tuple[str, str | None]]
    ) -> RunRecord | None:
        """The run's record (None when no base of it ran: there is nothing to rerun it on)."""
        engines = run.engine_records
        engine = next((engines[base] for base in run.bases if base in engines), None)
        if engine is None:
            return None
        several = len(run.bases) > 1
        conversation = sending.conversation
        columns = []
        for index, (request, column) in enumerate(zip(run.requests, self.columns, strict=True)):
            output = column.output
            digest, source = identities.get(request.name, (None, None))
            columns.append(
                ColumnRun(
                    name=request.name,
                    adapter=request.adapter,
                    adapter_scale=column_choice(request.name)[1],
                    adapter_digest=digest,
                    adapter_source=source,
                    overrides=sending.overrides[index],
                    settings=sending.settings[index],
                    prompt=request.prompt,
                    output=ColumnOutput(
                        text=column.text,
                        token_ids=tuple(output.token_ids) if output is not None else (),
                        finish_reason=column.finish_reason,
                        error=column.error,
                        ttft_s=column.ttft_s,
                        queue_s=column.queue_s,
                        tokens_per_second=column.tokens_per_second,
                    ),
                    base=engines.get(request.base) if several else None,
                )
            )
        return RunRecord(
            engine=engine,
            raw=conversation.raw,
            system_prompt=conversation.system_prompt,
            user_turns=tuple(conversation.user_turns),
            shared=sending.shared,
            columns=tuple(columns),
        )

    def _failed(self, message: str) -> None:
        sending = self._sending
        self.banner.show_message(message)
        self.run = self._sending = None
        self.conversation = sending.previous if sending is not None else None
        self._show_conversation()
        self._show_turns()
        self._set_running(False)
        self.summary.clear()
        self.runFinished.emit()

    def _set_running(self, running: bool) -> None:
        self.run_button.setEnabled(not running)
        self.stop_button.setEnabled(running)
        chat = self.conversation is not None and self.conversation.turns > 0 and not self.conversation.raw
        self.follow_button.setEnabled(not running and chat)
        self.edit_button.setEnabled(
            not running and self.conversation is not None and self.conversation.turns > 0
        )
        self.new_chat_button.setEnabled(not running)
        self.history_button.setEnabled(not running)
        for button in (self.copy_button, self.markdown_button, self.json_button):
            button.setEnabled(not running and self.comparison is not None)

    def _show_conversation(self) -> None:
        """Draw each column's chat as ``conversation`` holds it (after a send that failed)."""
        conversation = self.conversation
        if (
            conversation is None
            or [c.name for c in self.columns] != conversation.names
            or not conversation.turns
        ):
            return
        for index, column in enumerate(self.columns):
            answers = conversation.answers[index]
            column.begin_turn(
                list(zip(conversation.user_turns[:-1], answers[:-1], strict=False)),
                conversation.user_turns[-1],
            )
            column.text = answers[-1] if answers else ""
            column.redraw()

    def _show_turns(self) -> None:
        self.turns.clear()
        if self.conversation is not None:
            for number, text in enumerate(self.conversation.user_turns, 1):
                self.turns.addItem(f"{number}. {text.splitlines()[0] if text else ''}")

    def _clear_columns(self) -> None:
        for column in self.columns:
            column.setParent(None)
            column.deleteLater()
        self.columns = []
        self.column_bases = []

    # ---------------------------------------------------------------- divergence

    def _view_changed(self) -> None:
        mode = self.inputs.view_mode
        for column in self.columns:
            column.set_mode(mode)
        if mode == TOKENS and self.comparison is not None and self.run is None:
            missing = [c for c in self.columns if not c.reference and c.divergence is None]
            if missing:
                self.compute_divergence()

    def compute_divergence(self) -> bool:
        """Score the last answers under their adapters and their bases (one batch per base, each
        base leased, off the GUI thread)."""
        pool = self.host.pool
        if pool is None or self.run is not None or self.divergence_busy:
            return False
        wanted: list[tuple[int, str, DivergenceRequest]] = []  # column, its base, what to score
        for index, (column, base) in enumerate(zip(self.columns, self.column_bases, strict=True)):
            output = column.output
            if not column.reference and output is not None and output.token_ids:
                adapter, scale = column_choice(column.name)
                request = DivergenceRequest(output.prompt_token_ids, output.token_ids, adapter, scale)
                wanted.append((index, base, request))
        if not wanted:
            return False
        comparison = self.comparison
        self.divergence_busy = True
        self.summary.setText(f"scoring {len(wanted)} answers under their adapters and the base…")

        def score(task: Task) -> list[tuple[int, list[TokenDivergence], Callable[[int], str]]]:
            found = []
            for base in dict.fromkeys(base for _, base, _ in wanted):
                with self.host.lease(base) as engine:
                    vocab = engine.spec.vocab_size  # tokens the base lacks (added tokens): no base score
                    group = [
                        (index, request)
                        for index, on, request in wanted
                        if on == base and max([*request.prompt_token_ids, *request.output_token_ids]) < vocab
                    ]
                    results = score_divergence(engine, [request for _, request in group]) if group else []
                    found += [
                        (index, tokens, self._decoder(engine, request.adapter))
                        for (index, request), tokens in zip(group, results, strict=True)
                    ]
            return found

        def shown(results: list[tuple[int, list[TokenDivergence], Callable[[int], str]]]) -> None:
            self.divergence_busy = False
            if self.comparison is not comparison:  # a newer run replaced these columns
                return
            for index, tokens, decode in results:
                self.columns[index].show_divergence(tokens, decode)
            self.summary.setText(f"token divergence of {len(results)} answers from the base (hover a token)")
            self.divergenceFinished.emit()

        def failed(message: str) -> None:
            self.divergence_busy = False
            if self.host.pool is pool:  # not a pool stopped by a restart meanwhile
                self.banner.show_message(f"Could not score the answers: {message}")
            self.divergenceFinished.emit()

        self.tasks.run("divergence", score, shown, failed)
        return True

    @staticmethod
    def _decoder(engine: ServingEngine, adapter: str | None) -> Callable[[int], str]:
        tokenizer = engine.tokenizer_for(adapter)

        def decode(token_id: int) -> str:
            if tokenizer is None:
                return f"<{token_id}>"
            text = tokenizer.decode([token_id])
            return text if "\ufffd" not in text else str(tokenizer.convert_ids_to_tokens(token_id))

        return decode

    # ---------------------------------------------------------------- history

    def open_history(self) -> RunHistoryDialog:
        dialog = RunHistoryDialog(self.history, self)
        dialog.rerunRequested.connect(self.rerun)
        dialog.finished.connect(dialog.deleteLater)
        dialog.open()
        return dialog

    def rerun(self, record: RunRecord) -> bool:
        """Restore a past run's inputs and run it again with the prompts and settings it recorded,
        each column on the base it ran on (an adapter: the base that serves it now)."""
        if self.run is not None:
            return False
        pool = self.host.pool
        if pool is None:
            self.banner.show_message("The engine is not ready yet (see the status bar).", "warning")
            return False
        bases = [self._rerun_base(pool, record, c) for c in record.columns]
        missing = [
            c.name
            for c, base in zip(record.columns, bases, strict=True)
            if base is None or (c.adapter is not None and c.adapter not in pool.adapters_of(base))
        ]
        if missing:
            self.banner.show_message(f"Cannot rerun: the engine does not serve {', '.join(missing)}.")
            return False
        try:
            requests = [
                ColumnRequest(c.name, c.prompt, c.settings.sampling_params(), str(base))
                for c, base in zip(record.columns, bases, strict=True)
            ]
        except ValueError as error:
            self.banner.show_message(f"Cannot rerun: {error}")
            return False
        names = [c.name for c in record.columns]
        self.system.setPlainText(record.system_prompt)
        self.raw.setChecked(record.raw)
        self.prompt.setPlainText(record.user_turns[-1] if record.user_turns else "")
        self.inputs.show_shared_settings(record.shared)
        for column in record.columns:
            self.inputs.overrides[column.name] = column.overrides
        self._choose(names)
        conversation = Conversation.from_prompts(
            names, [c.prompt for c in record.columns], record.raw, list(record.user_turns)
        )
        sending = _Sending(
            self.conversation,
            conversation,
            record.shared,
            [c.overrides for c in record.columns],
            [c.settings for c in record.columns],
        )
        self._launch(pool, sending, requests, new_columns=True)
        changed = {
            (ran.model_name, ran.model_digest, str(base))
            for c, base in zip(record.columns, bases, strict=True)
            for ran in [c.base or record.engine]
            if ran.model_digest != pool.base(str(base)).digest
        }
        if changed:
            self.banner.show_message(
                "This run was recorded on "
                + "; ".join(
                    f"{name} (sha256 {digest[:12]}), the engine serves {base} "
                    f"(sha256 {pool.base(base).digest[:12]})"
                    for name, digest, base in sorted(changed)
                )
                + ": answers may differ.",
                "warning",
            )
        return True

    @staticmethod
    def _rerun_base(pool: BasePool, record: RunRecord, column: ColumnRun) -> str | None:
        """The base a recorded column runs on again: a column without an adapter on the base
        it ran on when that is served (else as its name says), an adapter on its base now."""
        recorded = (column.base or record.engine).model_name
        if column.adapter is None and recorded in pool.names:
            return recorded
        return column_base(pool, column.name)

    # ---------------------------------------------------------------- export

    def copy_markdown(self) -> None:
        if self.comparison is not None:
            QApplication.clipboard().setText(to_markdown(self.comparison))
            self.summary.setText("Markdown copied to the clipboard")

    def export(self, path: str | Path) -> Path:
        """Write the last comparison as Markdown (.md) or JSON (.json)."""
        if self.comparison is None:
            raise ValueError("run a comparison first")
        target = Path(path)
        text = to_json(self.comparison) if target.suffix == ".json" else to_markdown(self.comparison)
        target.write_text(text, encoding="utf-8")
        return target

    def _save(self, kind: str, suffix: str) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export the comparison", f"comparison{suffix}", kind)
        if not path:
            return
        try:
            written = self.export(path if path.endswith(suffix) else path + suffix)
        except (OSError, ValueError) as error:
            self.banner.show_message(f"Could not write {path}: {error}")
        else:
            self.banner.show_message(f"Saved {written}", "success")

    # ---------------------------------------------------------------- remembered choices

    def saved_widgets(self) -> list[QWidget]:
        """The inputs ``save_state`` records (the window saves again when any of them changes)."""
        return self.inputs.saved_widgets()

    def save_state(self, prefs: Preferences) -> None:
        self.inputs.save_state(prefs, self._wanted)

    def restore_state(self, prefs: Preferences) -> None:
        self._choose(self.inputs.restore_state(prefs))

    def _choose(self, names: list[str]) -> None:
        """Tick ``names``, listing the strength columns among them."""
        self._strengths.update(name for name in names if column_choice(name)[1] != 1.0)
        self.set_checked(names)
        self.refresh_adapters()
