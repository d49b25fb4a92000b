"""Arena view: a blind pairwise vote between two contenders' answers to one prompt, a leaderboard.

The contenders are the base and the adapters the first base serves (checkpoints of a run are
adapters of the library); the prompts are typed (one a line) or read from a prompt set. Each round
is one batched run of both answers (``arena.run_round``) on a background task, the next one
produced while the person reads. Names stay hidden ("Model A", "Model B") until the vote;
keyboard first: 1 A, 2 B, 3 tie, 4 both bad, Enter for the next round. *Ask the judge* lets a
served model (the base or an adapter) vote on the round shown (``arena.judge_round``), recorded
apart from people's votes. What happens is ``workflows.arena_session``'s; votes go to
``arena.sqlite3`` in the library folder.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from multilora_studio.arena import (
    VERDICT_WORDS,
    VERDICTS,
    ArenaSettings,
    Round,
    Vote,
    VoteStore,
    judge_round,
    prompt_set_prompts,
    run_round,
    typed_prompts,
    write_export,
)
from multilora_studio.engine import Prompt
from multilora_studio.gui.arena_board import ArenaBoard
from multilora_studio.gui.engine_host import EngineHost
from multilora_studio.gui.tasks import Task
from multilora_studio.gui.widgets import MessageBanner
from multilora_studio.gui.workflows.arena_session import ROUND, VOTES, ArenaSession, Ask
from multilora_studio.run_records import BASE, AdapterDigests

VOTE_LABELS = tuple(f"{key}  {VERDICT_WORDS[verdict]}" for key, verdict in enumerate(VERDICTS, 1))


class ArenaSetup(QGroupBox):
    """The contenders, the prompt source and the sampling settings both sides share."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Arena", parent)
        self.contenders = QListWidget()
        self.prompts = QPlainTextEdit()
        self.prompts.setPlaceholderText("Prompts, one a line (or pick a prompt set below)")
        self.prompt_set = QLineEdit()
        self.prompt_set.setPlaceholderText("Prompt set file (.jsonl or .csv)")
        self.browse = QPushButton("Browse…")
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 4096)
        self.max_tokens.setValue(ArenaSettings.max_tokens)
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(0.0, 2.0)
        self.temperature.setSingleStep(0.1)
        self.temperature.setValue(ArenaSettings.temperature)
        self.start = QPushButton("Start the arena")
        file_row = QHBoxLayout()
        file_row.addWidget(self.prompt_set, 1)
        file_row.addWidget(self.browse)
        form = QFormLayout()
        form.addRow("Max tokens", self.max_tokens)
        form.addRow("Temperature", self.temperature)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("Contenders"))
        layout.addWidget(self.contenders, 1)
        layout.addWidget(self.prompts, 1)
        layout.addLayout(file_row)
        layout.addLayout(form)
        layout.addWidget(self.start)
        self.browse.clicked.connect(self._browse)

    def list_contenders(self, names: list[str]) -> None:
        ticked = set(self.ticked())
        self.contenders.clear()
        for name in names:
            item = QListWidgetItem(name)
            item.setCheckState(Qt.CheckState.Checked if name in ticked else Qt.CheckState.Unchecked)
            self.contenders.addItem(item)

    def ticked(self) -> list[str]:
        items = (self.contenders.item(row) for row in range(self.contenders.count()))
        return [item.text() for item in items if item.checkState() == Qt.CheckState.Checked]

    def tick(self, names: list[str]) -> None:
        for row in range(self.contenders.count()):
            item = self.contenders.item(row)
            item.setCheckState(Qt.CheckState.Checked if item.text() in names else Qt.CheckState.Unchecked)

    def chosen_prompts(self) -> list[Prompt]:
        path = self.prompt_set.text().strip()
        if path:
            return prompt_set_prompts(Path(path))
        return list(typed_prompts(self.prompts.toPlainText()))

    def settings(self) -> ArenaSettings:
        return ArenaSettings(max_tokens=self.max_tokens.value(), temperature=self.temperature.value())

    def _browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Prompt set", "", "Prompt sets (*.jsonl *.csv)")
        if path:
            self.prompt_set.setText(path)


class AnswerPane(QWidget):
    """One side: its name (hidden until the vote) over its answer."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.name = QLabel()
        self.name.setStyleSheet("font-weight: bold; font-size: 12pt")
        self.answer = QTextBrowser()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.name)
        layout.addWidget(self.answer, 1)


class ArenaView(QWidget):
    """See the module docstring; ``voted`` fires after each recorded vote."""

    voted = Signal()

    def __init__(self, host: EngineHost, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.host = host
        self.store: VoteStore | None = None
        self.session: ArenaSession | None = None
        self.digests = AdapterDigests()
        self.task: Task | None = None
        self.judge_task: Task | None = None
        self.settings = ArenaSettings()
        self.banner = MessageBanner()
        self.setup = ArenaSetup()
        self.prompt = QLabel()
        self.prompt.setWordWrap(True)
        self.status = QLabel("Tick two contenders or more, give prompts and start the arena.")
        self.left, self.right = AnswerPane(), AnswerPane()
        self.vote_buttons = [QPushButton(label) for label in VOTE_LABELS]
        self.next_button = QPushButton("Next round (Enter)")
        self.export_button = QPushButton("Export…")
        self.judge_pick = QComboBox()
        self.judge_pick.setToolTip("The served model that votes when asked: the base or an adapter")
        self.judge_button = QPushButton("Ask the judge")
        self.judge_status = QLabel()
        self.judge_status.setWordWrap(True)
        self.board = ArenaBoard()
        self._lay_out()
        self._connect()
        self._refresh_round()

    def _lay_out(self) -> None:
        answers = QHBoxLayout()
        answers.addWidget(self.left)
        answers.addWidget(self.right)
        buttons = QHBoxLayout()
        for button in [*self.vote_buttons, self.next_button]:
            buttons.addWidget(button)
        buttons.addStretch(1)
        buttons.addWidget(QLabel("Judge"))
        buttons.addWidget(self.judge_pick)
        buttons.addWidget(self.judge_button)
        buttons.addWidget(self.export_button)
        play = QWidget()
        play_layout = QVBoxLayout(play)
        play_layout.setContentsMargins(0, 0, 0, 0)
        play_layout.addWidget(self.prompt)
        play_layout.addLayout(answers, 1)
        play_layout.addLayout(buttons)
        play_layout.addWidget(self.status)
        play_layout.addWidget(self.judge_status)
        right = QSplitter(Qt.Orientation.Vertical)
        right.addWidget(play)
        right.addWidget(self.board)
        right.setStretchFactor(0, 3)
        right.setStretchFactor(1, 2)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.setup)
        split.addWidget(right)
        split.setStretchFactor(1, 3)
        layout = QVBoxLayout(self)
        layout.addWidget(self.banner)
        layout.addWidget(split, 1)

    def _connect(self) -> None:
        self.setup.start.clicked.connect(self.start)
        for verdict, button in zip(VERDICTS, self.vote_buttons, strict=True):
            button.clicked.connect(lambda checked=False, v=verdict: self.vote(v))
        self.next_button.clicked.connect(self.next_round)
        self.export_button.clicked.connect(self._choose_export)
        self.judge_button.clicked.connect(self.ask_judge)
        context = Qt.ShortcutContext.WidgetWithChildrenShortcut
        for index, verdict in enumerate(VERDICTS):
            QShortcut(QKeySequence(str(index + 1)), self, lambda v=verdict: self.vote(v), context=context)
        for key in ("Return", "Enter"):
            QShortcut(QKeySequence(key), self, self.next_round, context=context)
        self.host.adaptersChanged.connect(self.relist)
        self.host.stateChanged.connect(lambda state: self.relist())

    def relist(self) -> None:
        """List the base and the first base's adapters as contenders."""
        engine = self.host.engine
        adapters = sorted(info.name for info in engine.list_adapters()) if engine is not None else []
        served = [BASE, *adapters] if engine is not None else []
        self.setup.list_contenders(served)
        judge = self.judge_pick.currentText()
        self.judge_pick.clear()
        self.judge_pick.addItems(served)
        if judge in served:
            self.judge_pick.setCurrentText(judge)

    # ---------------------------------------------------------------- the arena

    def start(self) -> bool:
        """Start an arena with the ticked contenders and the prompts given; problems in the banner."""
        if self.host.engine is None:  # starting, or the first base parked while another one runs
            self.banner.show_message(
                "The first base's engine is not loaded yet; start once it is.", "warning"
            )
            return False
        if self.session is None:
            self.store = VoteStore(self.host.registry.root)
            self.session = ArenaSession(self.store)
            self.session.changed.connect(self._session_changed)
        try:
            self.settings = self.setup.settings()
            ask = self.session.start(self.setup.ticked(), self.setup.chosen_prompts())
        except (ValueError, OSError) as error:
            self.banner.show_message(str(error))
            return False
        self.banner.clear()
        self._produce(ask)
        self._show_board()
        return True

    def _produce(self, ask: Ask) -> None:
        settings, digests = self.settings, self.digests

        def work(task: Task) -> Round:
            with self.host.lease() as engine:
                return run_round(
                    engine, ask.prompt, ask.left, ask.right, settings, digests, task.cancel_event
                )

        self.task = self.host.tasks.run("arena", work, self._delivered, self._failed, None, self._ended)

    def _delivered(self, produced: Round) -> None:
        if self.session is not None and self.session.running:
            self.session.delivered(produced)

    def _failed(self, message: str) -> None:
        if self.session is not None and self.session.running:  # not a round stopped with the arena
            self.session.failed(message)
            self.banner.show_message(f"The round failed: {message}")

    def _ended(self) -> None:
        self.task = None
        ask = self.session.wanted() if self.session is not None else None
        if ask is not None:
            self._produce(ask)

    def vote(self, verdict: str) -> bool:
        """Vote on the round shown (1/2/3/4); its names are shown after."""
        if self.session is None or self.session.vote(verdict) is None:
            return False
        self.voted.emit()
        return True

    def next_round(self) -> bool:
        """Show the next round (Enter); it shows as soon as it is ready when it is not yet."""
        return self.session is not None and self.session.next_round()

    def ask_judge(self) -> bool:
        """Let the model picked as judge vote on the round shown, off the GUI thread."""
        session, judge = self.session, self.judge_pick.currentText()
        shown = session.current if session is not None else None
        if shown is None or session is None or session.judge_vote is not None:
            return False
        if not judge or self.judge_task is not None:
            return False

        def work(task: Task) -> Vote:
            with self.host.lease() as engine:
                return judge_round(engine, judge, shown, task.cancel_event)

        self.judge_status.setText(f"judge:{judge} is reading both answers…")
        self.judge_task = self.host.tasks.run(
            "arena-judge", work, self._judged, self._judge_failed, None, self._judge_ended
        )
        self._refresh_round()
        return True

    def _judged(self, vote: Vote) -> None:
        if self.session is not None:
            self.session.judged(vote)

    def _judge_failed(self, message: str) -> None:
        if self.session is not None and self.session.running:
            self.banner.show_message(f"The judge could not vote: {message}")

    def _judge_ended(self) -> None:
        self.judge_task = None
        self._refresh_round()

    def stop(self) -> None:
        if self.session is not None:
            self.session.stop()
        for task in (self.task, self.judge_task):
            if task is not None:
                task.cancel()

    def _session_changed(self, what: str) -> None:
        if what in (ROUND, "message"):
            self._refresh_round()
        if what == VOTES:
            self._show_board()

    def _refresh_round(self) -> None:
        session = self.session
        current = session.current if session is not None else None
        revealed = session is not None and session.revealed
        a_name, b_name = session.names() if session is not None else ("Model A", "Model B")
        self.left.name.setText(a_name)
        self.right.name.setText(b_name)
        self.left.answer.setPlainText(current.output_left if current is not None else "")
        self.right.answer.setPlainText(current.output_right if current is not None else "")
        self.prompt.setText(f"<b>Prompt:</b> {current.prompt}" if current is not None else "")
        for button in self.vote_buttons:
            button.setEnabled(current is not None and not revealed)
        self.next_button.setEnabled(revealed)
        judged = session is not None and session.judge_vote is not None
        self.judge_button.setEnabled(current is not None and not judged and self.judge_task is None)
        if session is not None:
            self.status.setText(session.message)
        if self.judge_task is None:
            self.judge_status.setText(session.judge_text() if session is not None else "")

    def _show_board(self) -> None:
        if self.session is not None:
            self.board.show_board(self.session.board(), self.session.agreements())

    def export(self, path: Path) -> None:
        """Write the votes and the leaderboard (JSON) or the votes (CSV) to ``path``."""
        if self.session is None:
            raise ValueError("no arena yet")
        votes = self.session.store.votes()
        write_export(path, votes, self.session.board())

    def _choose_export(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self, "Export the arena", "arena.json", "JSON (*.json);;CSV (*.csv)"
        )
        if path:
            try:
                self.export(Path(path))
            except (ValueError, OSError) as error:
                self.banner.show_message(str(error))
