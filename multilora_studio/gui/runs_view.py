"""Runs view: training runs followed as they write checkpoints, their scores and losses per step.

*Watch* follows a trainer's output folder (``gui/runs_follow.py`` polls it on a background task:
each checkpoint imported as ``RUN@step-N``, served, scored on the run's prompt set). The plot
shows the mean score per checkpoint with its spread, the best marked, and the losses below; a
click on the curve opens Compare on the base, the best, the latest and the clicked checkpoint.
*Keep the best* retires the run's other checkpoints, *Archive the rest* packs them away, *Merge
and export* opens the merge dialog on the best. The rules are ``workflows.runs_board``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from multilora_studio.adapters.registry_runs import CheckpointRecord, RunRecord
from multilora_studio.gui.engine_host import EngineHost
from multilora_studio.gui.merge_dialog import MergeDialog
from multilora_studio.gui.runs_follow import RunsFollow
from multilora_studio.gui.runs_plot import RunsPlot
from multilora_studio.gui.tasks import Task
from multilora_studio.gui.widgets import MessageBanner, fill_rows, read_only_table
from multilora_studio.gui.workflows.runs_board import RunsBoard
from multilora_studio.runs import RunUpdate

COLUMNS = ("Step", "Checkpoint", "Loss", "Eval loss", "Mean score ± spread", "")


class WatchForm(QGroupBox):
    """The folder, name and prompt set of a run to follow."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Watch a training run", parent)
        self.folder = QLineEdit(placeholderText="the trainer's output folder (checkpoint-N/ inside)")
        self.name = QLineEdit(placeholderText="default: the folder's name")
        self.prompts = QLineEdit(placeholderText="optional .jsonl or .csv: each checkpoint is scored on it")
        self.watch_button = QPushButton("Watch")
        form = QFormLayout(self)
        form.addRow("Folder", with_browse(self.folder, self._pick_folder))
        form.addRow("Run name", self.name)
        form.addRow("Prompt set", with_browse(self.prompts, self._pick_prompts))
        form.addRow(self.watch_button)

    def values(self) -> tuple[str, Path, Path | None]:
        """(name, folder, prompt set); ValueError for a folder that is not one."""
        text = self.folder.text().strip()
        if not text:
            raise ValueError("choose the training run's output folder")
        folder = Path(text).expanduser()
        if not folder.is_dir():
            raise ValueError(f"{folder} is not a folder")
        prompts = self.prompts.text().strip()
        return self.name.text().strip() or folder.resolve().name, folder, Path(prompts) if prompts else None

    def _pick_folder(self) -> None:
        chosen = QFileDialog.getExistingDirectory(self, "Training output folder")
        if chosen:
            self.folder.setText(chosen)

    def _pick_prompts(self) -> None:
        chosen, _ = QFileDialog.getOpenFileName(self, "Prompt set", "", "Prompt sets (*.jsonl *.csv)")
        if chosen:
            self.prompts.setText(chosen)


def with_browse(edit: QLineEdit, browse: Callable[[], None]) -> QWidget:
    """``edit`` with a *Browse…* button beside it that calls ``browse``."""
    row = QWidget()
    layout = QHBoxLayout(row)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.addWidget(edit, 1)
    button = QPushButton("Browse…")
    button.clicked.connect(browse)
    layout.addWidget(button)
    return row


class RunsView(QWidget):
    """The runs list, the picked run's curves and checkpoints, and its actions."""

    compareRequested = Signal(list)  # the Compare columns: base, best, latest (and one clicked)
    refreshed = Signal()

    def __init__(self, host: EngineHost, parent: QWidget | None = None, poll_ms: int | None = None) -> None:
        super().__init__(parent)
        self.host = host
        self.board = RunsBoard()
        self.follow = RunsFollow(host, self) if poll_ms is None else RunsFollow(host, self, poll_ms)
        self.banner = MessageBanner()
        self.run_list = QListWidget()
        self.watch_form = WatchForm()
        self.stop_button = QPushButton("Stop watching")
        self.summary = QLabel()
        self.summary.setWordWrap(True)
        self.plot = RunsPlot()
        self.table = read_only_table(COLUMNS, 120, 16777215)
        self.compare_button = QPushButton("Compare best, latest and base")
        self.keep_best_button = QPushButton("Keep the best, retire the rest")
        self.archive_button = QPushButton("Archive the rest")
        self.merge_button = QPushButton("Merge and export the best…")
        self.merge_dialog: MergeDialog | None = None
        self.reading = False
        self._read_again = False
        self._lay_out()
        self._connect()
        self.refresh()

    def _lay_out(self) -> None:
        left = QWidget()
        side = QVBoxLayout(left)
        side.setContentsMargins(0, 0, 0, 0)
        side.addWidget(QLabel("Runs"))
        side.addWidget(self.run_list, 1)
        side.addWidget(self.stop_button)
        side.addWidget(self.watch_form)
        right = QWidget()
        main = QVBoxLayout(right)
        main.setContentsMargins(0, 0, 0, 0)
        main.addWidget(self.summary)
        main.addWidget(self.plot, 3)
        main.addWidget(self.table, 2)
        actions = QHBoxLayout()
        for button in (self.compare_button, self.keep_best_button, self.archive_button, self.merge_button):
            actions.addWidget(button)
        actions.addStretch(1)
        main.addLayout(actions)
        splitter = QSplitter()
        splitter.addWidget(left)
        splitter.addWidget(right)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([320, 900])
        layout = QVBoxLayout(self)
        layout.addWidget(self.banner)
        layout.addWidget(splitter, 1)

    def _connect(self) -> None:
        self.run_list.currentTextChanged.connect(self._picked)
        self.watch_form.watch_button.clicked.connect(self.watch)
        self.stop_button.clicked.connect(self.stop_watching)
        self.compare_button.clicked.connect(self._compare_clicked)
        self.keep_best_button.clicked.connect(self.keep_best)
        self.archive_button.clicked.connect(self.archive_rest)
        self.merge_button.clicked.connect(self.open_merge_dialog)
        self.plot.stepClicked.connect(self.clicked_step)
        self.follow.polled.connect(self._polled)
        self.follow.failed.connect(self.banner.show_message)

    # ---------------------------------------------------------------- reading the library

    def refresh(self) -> None:
        """Re-read the runs and the picked run's checkpoints on a task, then show them."""
        if self.reading:
            self._read_again = True
            return
        self.reading = True
        registry, picked = self.host.registry, self.board.picked

        def read(task: Task) -> tuple[list[RunRecord], list[CheckpointRecord]]:
            runs = registry.runs()
            name = picked if picked in [run.name for run in runs] else (runs[0].name if runs else None)
            return runs, registry.checkpoints(name) if name is not None else []

        self.host.tasks.run(
            "read the runs", read, self._show, self.banner.show_message, on_done=self._read_done
        )

    def _read_done(self) -> None:
        self.reading = False
        if self._read_again:
            self._read_again = False
            self.refresh()

    def _show(self, value: tuple[list[RunRecord], list[CheckpointRecord]]) -> None:
        runs, checkpoints = value
        self.board.show(runs, checkpoints)
        names = [run.name for run in runs]
        if [self.run_list.item(i).text() for i in range(self.run_list.count())] != names:
            self.run_list.blockSignals(True)
            self.run_list.clear()
            self.run_list.addItems(names)
            self.run_list.blockSignals(False)
        if self.board.picked is not None and self.run_list.currentItem() is None:
            self.run_list.blockSignals(True)
            self.run_list.setCurrentRow(names.index(self.board.picked))
            self.run_list.blockSignals(False)
        self.summary.setText(self.board.summary())
        best = self.board.best
        self.plot.show_curves(
            self.board.curves(),
            None if best is None else float(best.checkpoint.step),
            None if best is None else best.mean,
        )
        fill_rows(self.table, [tuple(vars(row).values()) for row in self.board.rows()])
        has_best = best is not None
        self.compare_button.setEnabled(self.board.latest is not None)
        self.keep_best_button.setEnabled(has_best and bool(self.board.others_than_best()))
        self.archive_button.setEnabled(has_best and bool(self.board.others_than_best()))
        self.merge_button.setEnabled(has_best)
        self.stop_button.setEnabled(self.board.run is not None and self.board.run.watching)
        self.refreshed.emit()

    def _picked(self, name: str) -> None:
        self.board.pick(name or None)
        self.refresh()

    def _polled(self, updates: list[RunUpdate]) -> None:
        if any(update.changed for update in updates):
            self.refresh()

    # ---------------------------------------------------------------- actions

    def watch(self) -> Task | None:
        try:
            name, folder, prompts = self.watch_form.values()
        except ValueError as error:
            self.banner.show_message(str(error))
            return None
        try:
            task = self.follow.watch(name, folder, prompts, lambda: self._watching(name, folder))
        except RuntimeError as error:  # no engine yet: the base the checkpoints are checked against
            self.banner.show_message(str(error))
            return None
        self.banner.show_message(f"Watching {folder} as run {name!r}…", "info")
        self.board.pick(name)
        return task

    def _watching(self, name: str, folder: Path) -> None:
        self.banner.show_message(
            f"Following run {name!r}: checkpoints in {folder} are imported as they appear", "success"
        )
        self.refresh()

    def stop_watching(self) -> None:
        run = self.board.run
        if run is not None:
            self.follow.stop(run.name)
            self.refresh()

    def clicked_step(self, step: float) -> None:
        """A click on the curve: Compare on base, best, latest and the checkpoint nearest ``step``."""
        self.open_compare(self.board.checkpoint_near(step))

    def _compare_clicked(self) -> None:
        self.open_compare()

    def open_compare(self, clicked: CheckpointRecord | None = None) -> list[str]:
        columns = self.board.compare_columns(clicked)
        self.compareRequested.emit(columns)
        return columns

    def keep_best(self) -> Task | None:
        return self._lifecycle("retire", "kept the best")

    def archive_rest(self) -> Task | None:
        return self._lifecycle("archive", "archived: not the best of its run")

    def _lifecycle(self, action: str, reason: str) -> Task | None:
        names = self.board.others_than_best()
        registry = self.host.registry
        if not names:
            return None

        def work(task: Task) -> int:
            done = 0
            for index, name in enumerate(names):
                task.report(index / len(names), f"{action} {name}")
                record = registry.get(name)
                if action == "retire" and record.state == "active":
                    registry.retire(name, reason)
                elif action == "archive" and record.state != "archived":
                    registry.archive(name, reason)
                else:
                    continue
                done += 1
            return done

        def finished(done: int) -> None:
            self.banner.show_message(f"{action.capitalize()}d {done} checkpoints of the run", "success")
            self.host.reload_adapters()
            self.refresh()

        return self.host.tasks.run(f"{action} checkpoints", work, finished, self.banner.show_message)

    def open_merge_dialog(self) -> MergeDialog | None:
        best = self.board.best
        if best is None:
            return None
        if self.merge_dialog is None:
            self.merge_dialog = MergeDialog(self.host, best.checkpoint.adapter, self)
        else:
            self.merge_dialog.reload(best.checkpoint.adapter)
        self.merge_dialog.show()
        self.merge_dialog.raise_()
        return self.merge_dialog
