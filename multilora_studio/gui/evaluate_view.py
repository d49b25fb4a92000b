"""Evaluate view: a prompt-set file through the ticked adapters (and the base), scored per adapter;
while no file is given, *Try the demo prompt set* fills in the demo adapters' example set.

What runs, on which base, and what the person is told is ``workflows.evaluate_session``'s; this view
binds its control groups (``evaluate_controls``) to it and runs each evaluation as one background
task over the engine of the base model picked above the adapter list (shown when the window serves
several; it lists that base's adapters), leased: a swapped-out base is loaded first, its load shown
in the progress bar (``evaluate.run_eval``: every prompt with every adapter in shared batches),
with progress and Cancel. When it ends the matrix shows each output tinted by pass or fail, the
scores table each adapter's numbers, the drill-down one prompt's outputs side by side; the results
are saved as JSON and the library records the scores of its adapters. *Rerun…* (or a double click
in *Recent*, the newest saved results first) runs a saved evaluation again (``evaluate.Rerun``) on
the base with the weights it ran on: the view's inputs show what it ran, and a changed prompt set,
a base no longer served or changed adapter weights are refused in the banner.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from multilora_studio.evaluate import EvalResults, default_results_dir
from multilora_studio.gui.engine_host import EngineHost
from multilora_studio.gui.evaluate_controls import (
    EXPORTS,
    EvaluateOptions,
    EvaluateRunControls,
    EvaluateTicks,
)
from multilora_studio.gui.evaluate_tables import DrillDown, MatrixTable, ScoresTable
from multilora_studio.gui.field_binding import bind_text
from multilora_studio.gui.preferences import Preferences
from multilora_studio.gui.prompt_set_field import PromptSetField
from multilora_studio.gui.tasks import Task
from multilora_studio.gui.widgets import MessageBanner
from multilora_studio.gui.workflows.evaluate_session import RESULTS, EvaluateSession, Evaluation, Finished


class EvaluateView(QWidget):
    """See the module docstring; ``runFinished`` fires when a run ended (done, failed or cancelled)."""

    runFinished = Signal()

    def __init__(self, host: EngineHost, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.host = host
        self.session = session = EvaluateSession(lambda: host.pool, host.registry)
        self.task: Task | None = None
        self.banner = MessageBanner()
        self.prompt_set = PromptSetField()
        self.ticks = EvaluateTicks(session.inputs)
        self.options = EvaluateOptions(session.inputs)
        self.controls = EvaluateRunControls(session)
        self.matrix, self.scores, self.drill_down = MatrixTable(), ScoresTable(), DrillDown()
        self.path, self.adapters, self.base_picker = (
            self.prompt_set.path,
            self.ticks.adapters,
            self.ticks.base_picker,
        )
        self.max_tokens, self.chat = self.options.max_tokens, self.options.chat
        self.default_check = self.options.default_check
        controls = self.controls
        self.run_button, self.rerun_button, self.cancel_button = (
            controls.run_button,
            controls.rerun_button,
            controls.cancel_button,
        )
        self.progress, self.summary, self.recent = controls.progress, controls.summary, controls.recent
        self.export_buttons = controls.export_buttons
        self._connect()
        self._lay_out()

    def _connect(self) -> None:
        session, controls = self.session, self.controls
        bind_text(session.inputs, "prompt_set", self.path)
        self.prompt_set.demoChosen.connect(session.inputs.tick_demo)
        session.told.connect(
            lambda text, kind: self.banner.show_message(text, kind) if text else self.banner.clear()
        )
        session.changed.connect(lambda what: self._show_results() if what == RESULTS else None)
        controls.run_button.clicked.connect(self.start)
        controls.cancel_button.clicked.connect(self.stop)
        controls.rerun_button.clicked.connect(self._choose_rerun)
        controls.recent.itemActivated.connect(
            lambda item: self.rerun(Path(item.data(Qt.ItemDataRole.UserRole)))
        )
        for button, (label, suffix) in zip(controls.export_buttons, EXPORTS, strict=True):
            button.clicked.connect(lambda checked=False, s=suffix, k=label: self._save(k, s))
        self.matrix.itemSelectionChanged.connect(self._selection_changed)
        self.host.adaptersChanged.connect(session.inputs.relist)
        self.host.stateChanged.connect(lambda state: session.inputs.relist())

    def _lay_out(self) -> None:
        options = QFormLayout()
        self.options.lay_out(options)
        recent_box = QVBoxLayout()
        recent_box.addWidget(QLabel("<b>Recent</b>"))
        recent_box.addWidget(self.recent, 1)
        top = QHBoxLayout()
        top.addWidget(self.ticks, 2)
        top.addLayout(options, 1)
        top.addLayout(recent_box, 1)
        buttons = QHBoxLayout()
        self.controls.lay_out(buttons)
        controls = QWidget()
        controls_layout = QVBoxLayout(controls)
        controls_layout.setContentsMargins(0, 0, 0, 0)
        controls_layout.addWidget(self.prompt_set)
        controls_layout.addLayout(top)
        controls_layout.addLayout(buttons)
        controls_layout.addWidget(self.summary)
        self.tabs = QTabWidget()
        self.tabs.addTab(self.matrix, "Matrix")
        self.tabs.addTab(self.scores, "Scores")
        results = QSplitter(Qt.Orientation.Vertical)
        results.addWidget(self.tabs)
        results.addWidget(self.drill_down)
        results.setStretchFactor(0, 3)
        results.setStretchFactor(1, 2)
        vertical = QSplitter(Qt.Orientation.Vertical)
        vertical.addWidget(controls)
        vertical.addWidget(results)
        vertical.setStretchFactor(1, 3)
        layout = QVBoxLayout(self)
        layout.addWidget(self.banner)
        layout.addWidget(vertical, 1)

    # ---------------------------------------------------------------- the session's state

    @property
    def running(self) -> bool:
        return self.task is not None

    @property
    def results(self) -> EvalResults | None:
        return self.session.results

    @property
    def saved(self) -> Path | None:
        return self.session.saved

    @property
    def results_dir(self) -> Path | None:
        """Where results are saved (None: evaluations/ in the user data directory)."""
        return self.session.results_dir

    @results_dir.setter
    def results_dir(self, folder: Path | None) -> None:
        self.session.results_dir = folder

    # ---------------------------------------------------------------- choices

    def picked_base(self) -> str | None:
        """The base model the view evaluates on (None while no engine runs)."""
        return self.session.inputs.shown

    def pick_base(self, base: str) -> bool:
        """Evaluate on ``base``: list its adapters; False when the window does not serve it."""
        return self.session.inputs.pick_base(base)

    def checked_names(self) -> list[str]:
        return self.session.inputs.ticked()

    def set_checked(self, names: list[str]) -> None:
        self.session.inputs.tick(names)

    def tick_all(self, checked: bool) -> None:
        self.session.inputs.tick_all(checked)

    # ---------------------------------------------------------------- running

    def start(self) -> bool:
        """Start a run with the current choices; a problem shows in the banner."""
        return self._launch(self.session.start())

    def rerun(self, path: Path) -> bool:
        """Run the saved evaluation ``path`` again, its inputs shown in the view; problems in the banner."""
        return self._launch(self.session.rerun(path))

    def _choose_rerun(self) -> None:
        folder = self.results_dir if self.results_dir is not None else default_results_dir()
        path, _ = QFileDialog.getOpenFileName(
            self, "Rerun a saved evaluation", str(folder), "Saved evaluations (*.json)"
        )
        if path:
            self.rerun(Path(path))

    def _launch(self, evaluation: Evaluation | None) -> bool:
        if evaluation is None:
            return False
        self.controls.progress.setValue(0)

        def work(task: Task) -> Finished:
            return evaluation.work(
                lambda base: self.host.lease(base, task.notify), task.report, task.cancel_event
            )

        self.task = self.host.tasks.run(
            "evaluate", work, self.session.succeeded, self._failed, self.controls.show_progress, self._ended
        )
        return True

    def stop(self) -> None:
        """Cancel the run (its requests are aborted in the engine)."""
        if self.task is not None:
            self.task.cancel()

    def _failed(self, message: str) -> None:
        self.session.failed(message, self.task is not None and self.task.cancelled)

    def _ended(self) -> None:
        self.task = None
        self.session.ended()
        self.runFinished.emit()

    # ---------------------------------------------------------------- results

    def _show_results(self) -> None:
        results = self.session.results
        if results is None:
            return
        self.matrix.show_results(results)
        self.scores.show_results(results)
        for button in self.export_buttons:
            button.setEnabled(True)
        if results.prompts:
            self.matrix.selectRow(0)

    def _selection_changed(self) -> None:
        rows = {index.row() for index in self.matrix.selectedIndexes()}
        if self.results is not None and len(rows) == 1:
            self.drill_down.show_row(self.results, rows.pop())

    def export(self, path: str | Path) -> Path:
        """Write the last results as CSV, JSON or Markdown (by the suffix)."""
        return self.session.export(path)

    def _save(self, kind: str, suffix: str) -> None:
        name = self.session.export_name(suffix)
        path, _ = QFileDialog.getSaveFileName(self, "Export the evaluation", name, f"{kind} (*{suffix})")
        if path:
            self.session.save_export(path, suffix)

    # ---------------------------------------------------------------- remembered choices

    def saved_widgets(self) -> list[QWidget]:
        """The inputs ``save_state`` records (the window saves again when any of them changes)."""
        return [self.path, self.adapters, self.base_picker, self.max_tokens, self.default_check, self.chat]

    def save_state(self, prefs: Preferences) -> None:
        self.session.inputs.save(prefs)

    def restore_state(self, prefs: Preferences) -> None:
        self.session.inputs.restore(prefs)
