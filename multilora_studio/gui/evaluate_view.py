"""Evaluate view: a prompt-set file through the ticked adapters (and the base), scored per adapter;
while no file is given, *Try the demo prompt set* fills in the demo adapters' example set.

The run is one background task over the engine of the base model picked above the adapter list
(shown when the window serves several; it lists that base's adapters), leased: a swapped-out
base is loaded first, its load shown in the progress bar (``evaluate.run_eval``: every prompt
with every adapter in shared batches), with progress and Cancel. When it ends the matrix shows
each output tinted by pass or fail, the scores table each adapter's numbers, the drill-down one
prompt's outputs side by side; the results are saved as JSON and the library records the scores
of its adapters. *Rerun…* (or a double click in *Recent*, the newest saved results first) runs a
saved evaluation again (``evaluate.Rerun``) on the base with the weights it ran on: the view's
inputs show what it ran, and a changed prompt set, a base no longer served or changed adapter
weights are refused in the banner.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from multilora_studio.demo import demo_adapter_dirs
from multilora_studio.evaluate import (
    BASE,
    EvalResults,
    EvalSettings,
    Rerun,
    changed_cells,
    default_results_dir,
    load_prompt_set,
    read_results_json,
    recent_results,
    record_scores,
    run_eval,
    save_results,
    write_export,
)
from multilora_studio.gui.engine_host import EngineHost
from multilora_studio.gui.evaluate_tables import DrillDown, MatrixTable, ScoresTable
from multilora_studio.gui.preferences import Preferences
from multilora_studio.gui.prompt_set_field import PromptSetField
from multilora_studio.gui.tasks import Task
from multilora_studio.gui.widgets import MessageBanner
from multilora_studio.run_records import AdapterDigests

DEFAULT_CHECKS = ("the file's", "exact", "contains")  # the first: each row's own check only
EXPORTS = (("CSV", ".csv"), ("JSON", ".json"), ("Markdown", ".md"))
RECENT = 10  # saved evaluations listed


@dataclass(frozen=True)
class Finished:
    """What a run's task hands back: the results, where they were saved, the adapters recorded.

    A rerun also hands back the rerun (``rerun``) and its warnings.
    """

    results: EvalResults
    saved: Path
    recorded: list[str]
    rerun: Rerun | None = None
    warnings: tuple[str, ...] = ()


class EvaluateView(QWidget):
    """See the module docstring; ``runFinished`` fires when a run ended (done, failed or cancelled)."""

    runFinished = Signal()

    def __init__(self, host: EngineHost, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.host = host
        self.task: Task | None = None
        self.results: EvalResults | None = None
        self.saved: Path | None = None
        self.results_dir: Path | None = None  # None: evaluations/ in the user data directory
        self._wanted: set[str] = {BASE}
        self.digests = AdapterDigests()
        self.banner = MessageBanner()

        self.prompt_set = PromptSetField()
        self.prompt_set.demoChosen.connect(lambda: self.set_checked([BASE, *demo_adapter_dirs()]))
        self.path = self.prompt_set.path
        self.adapters = QListWidget()
        self.adapters.setToolTip("Tick the adapters to evaluate; 'base' is the model without an adapter")
        self.adapters.itemChanged.connect(self._ticks_changed)
        self.adapters.setMaximumHeight(120)
        self.base_picker = QComboBox()
        self.base_picker.setToolTip("The base model to evaluate on; its adapters are listed")
        self.base_picker.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.base_picker.currentIndexChanged.connect(lambda *_: self.refresh_adapters())
        self.base_picker.hide()
        self._picked: str | None = None  # the base picked, kept while the bases are listed again
        every, none = QPushButton("All"), QPushButton("None")
        every.clicked.connect(lambda: self.tick_all(True))
        none.clicked.connect(lambda: self.tick_all(False))
        self.max_tokens = QSpinBox(minimum=0, maximum=32768, value=EvalSettings().max_tokens)
        self.max_tokens.setToolTip("0: score references and choices only, generate nothing")
        self.chat = QCheckBox("Send text prompts as chat")
        self.default_check = QComboBox()
        self.default_check.addItems(list(DEFAULT_CHECKS))
        self.default_check.setToolTip(
            "The check of rows that have none (exact and contains need a reference)"
        )
        self.run_button = QPushButton("Run")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.run_button.clicked.connect(self.start)
        self.cancel_button.clicked.connect(self.stop)
        self.rerun_button = QPushButton("Rerun…")
        self.rerun_button.setToolTip(
            "Run a saved evaluation again: the same prompt set, adapters and settings"
        )
        self.rerun_button.clicked.connect(self._choose_rerun)
        self.recent = QListWidget()
        self.recent.setToolTip("Saved evaluations, newest first: double-click one to run it again")
        self.recent.setMaximumHeight(90)
        self.recent.itemActivated.connect(lambda item: self.rerun(Path(item.data(Qt.ItemDataRole.UserRole))))
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setValue(0)
        self.summary = QLabel()
        self.summary.setWordWrap(True)
        self.export_buttons = []
        for label, suffix in EXPORTS:
            button = QPushButton(f"Save {label}…")
            button.setEnabled(False)
            button.clicked.connect(lambda checked=False, s=suffix, k=label: self._save(k, s))
            self.export_buttons.append(button)

        self.matrix = MatrixTable()
        self.matrix.itemSelectionChanged.connect(self._selection_changed)
        self.scores = ScoresTable()
        self.drill_down = DrillDown()

        ticks = QHBoxLayout()
        ticks.addWidget(QLabel("<b>Adapters</b>"), 1)
        ticks.addWidget(self.base_picker)
        ticks.addWidget(every)
        ticks.addWidget(none)
        adapter_box = QVBoxLayout()
        adapter_box.addLayout(ticks)
        adapter_box.addWidget(self.adapters, 1)
        options = QFormLayout()
        options.addRow("Max tokens", self.max_tokens)
        options.addRow("Default check", self.default_check)
        options.addRow(self.chat)
        recent_box = QVBoxLayout()
        recent_box.addWidget(QLabel("<b>Recent</b>"))
        recent_box.addWidget(self.recent, 1)
        top = QHBoxLayout()
        top.addLayout(adapter_box, 2)
        top.addLayout(options, 1)
        top.addLayout(recent_box, 1)
        buttons = QHBoxLayout()
        buttons.addWidget(self.run_button)
        buttons.addWidget(self.rerun_button)
        buttons.addWidget(self.cancel_button)
        buttons.addWidget(self.progress, 1)
        for button in self.export_buttons:
            buttons.addWidget(button)
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
        host.adaptersChanged.connect(self.refresh_adapters)
        host.stateChanged.connect(lambda state: self.refresh_adapters())
        self.refresh_recent()

    # ---------------------------------------------------------------- choices

    def refresh_adapters(self) -> None:
        """List 'base' and every adapter the picked base model serves, ticked as the person left them."""
        self._show_bases()
        pool, base = self.host.pool, self.picked_base()
        names = [BASE, *sorted(pool.adapters_of(base))] if pool is not None and base is not None else []
        self.adapters.blockSignals(True)
        self.adapters.clear()
        for name in names:
            item = QListWidgetItem(name)
            item.setData(Qt.ItemDataRole.UserRole, name)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Checked if name in self._wanted else Qt.CheckState.Unchecked)
            self.adapters.addItem(item)
        self.adapters.blockSignals(False)

    def _show_bases(self) -> None:
        """The base picker lists every base (shown only when there are several)."""
        pool = self.host.pool
        names = pool.names if pool is not None else []
        if self.base_picker.currentData() is not None:
            self._picked = self.base_picker.currentData()
        self.base_picker.blockSignals(True)
        self.base_picker.clear()
        for name in names:
            self.base_picker.addItem(name, name)
        self.base_picker.setCurrentIndex(max(0, self.base_picker.findData(self._picked)))
        self.base_picker.blockSignals(False)
        self.base_picker.setVisible(len(names) > 1)

    def picked_base(self) -> str | None:
        """The base model the view evaluates on (None while no engine runs)."""
        return self.base_picker.currentData()

    def pick_base(self, base: str) -> bool:
        """Evaluate on ``base``: list its adapters; False when the window does not serve it."""
        index = self.base_picker.findData(base)
        if index >= 0:
            self._picked = base
            self.base_picker.setCurrentIndex(index)
        return index >= 0

    def _ticks_changed(self) -> None:
        listed = {self.adapters.item(i).data(Qt.ItemDataRole.UserRole) for i in range(self.adapters.count())}
        self._wanted = (self._wanted - listed) | set(self.checked_names())

    def checked_names(self) -> list[str]:
        items = [self.adapters.item(i) for i in range(self.adapters.count())]
        return [
            item.data(Qt.ItemDataRole.UserRole)
            for item in items
            if item.checkState() == Qt.CheckState.Checked
        ]

    def set_checked(self, names: list[str]) -> None:
        self._wanted = set(names)
        self.refresh_adapters()

    def tick_all(self, checked: bool) -> None:
        state = Qt.CheckState.Checked if checked else Qt.CheckState.Unchecked
        for i in range(self.adapters.count()):
            self.adapters.item(i).setCheckState(state)

    def settings(self) -> EvalSettings:
        return EvalSettings(max_tokens=self.max_tokens.value(), chat=self.chat.isChecked())

    def refresh_recent(self) -> None:
        """List the newest saved evaluations of the results folder."""
        self.recent.clear()
        for path in recent_results(self.results_dir, RECENT):
            item = QListWidgetItem(path.stem)
            item.setData(Qt.ItemDataRole.UserRole, str(path))
            item.setToolTip(str(path))
            self.recent.addItem(item)

    # ---------------------------------------------------------------- running

    @property
    def running(self) -> bool:
        return self.task is not None

    def start(self) -> bool:
        """Start a run with the current choices; a problem shows in the banner."""
        if self.task is not None:
            return False
        pool, names, path = self.host.pool, self.checked_names(), self.path.text().strip()
        base = self.picked_base()
        problem = (
            "Choose a prompt set file first."
            if not path
            else "The engine is not ready yet."
            if pool is None
            else "Tick at least one adapter (or base)."
            if not names
            else None
        )
        if problem is not None or pool is None or base is None:
            self.banner.show_message(problem or "The engine is not ready yet.", "warning")
            return False
        default = self.default_check.currentText() if self.default_check.currentIndex() > 0 else None
        settings, registry, folder, digests = (
            self.settings(),
            self.host.registry,
            self.results_dir,
            self.digests,
        )

        def work(task: Task) -> Finished:
            prompt_set = load_prompt_set(Path(path), default)
            with self.host.lease(base, task.notify) as engine:  # loaded if it was swapped out
                results = run_eval(
                    engine, prompt_set, names, settings, task.report, task.cancel_event, digests
                )
            saved = save_results(results, folder)
            return Finished(results, saved, record_scores(registry, results, saved))

        on = f" (base model {base})" if len(pool.names) > 1 else ""
        self._launch(work, f"Evaluating {Path(path).name} on {', '.join(names)}{on}…")
        return True

    def rerun(self, path: Path) -> bool:
        """Run the saved evaluation ``path`` again, its inputs shown in the view; problems in the banner."""
        if self.task is not None:
            return False
        if self.host.pool is None:
            self.banner.show_message("The engine is not ready yet.", "warning")
            return False
        try:
            saved = read_results_json(path)
        except (OSError, ValueError) as error:
            self.banner.show_message(f"Cannot rerun: {error}")
            return False
        base = self.host.base_with_weights(saved.base_digest, saved.model)
        if base is None:
            self.banner.show_message(
                f"Cannot rerun: the evaluation ran on {saved.model} (sha256 "
                f"{saved.base_digest[:12] or 'unknown'}), which is not among the base models in Settings."
            )
            return False
        self.pick_base(base)
        self.show_inputs(saved)
        registry, folder, digests = self.host.registry, self.results_dir, self.digests

        def work(task: Task) -> Finished:
            rerun = Rerun.of(saved)
            with self.host.lease(base, task.notify) as engine:  # loaded if it was swapped out
                warnings = rerun.check_engine(engine, digests)
                results = rerun.run(engine, task.report, task.cancel_event, digests)
            written = save_results(results, folder)
            return Finished(
                results, written, record_scores(registry, results, written), rerun, tuple(warnings)
            )

        self._launch(work, f"Rerunning {Path(path).name} on {', '.join(saved.adapters)}…")
        return True

    def show_inputs(self, saved: EvalResults) -> None:
        """Show what ``saved`` ran in the view's inputs (the prompt set, ticks, max tokens, check, chat)."""
        settings = EvalSettings.from_dict(saved.settings)
        self.path.setText(saved.prompt_set_path)
        self.set_checked(saved.adapters)
        self.max_tokens.setValue(settings.max_tokens)
        self.chat.setChecked(settings.chat)
        kind = None if saved.default_check is None else saved.default_check.get("type")
        self.default_check.setCurrentIndex(max(0, self.default_check.findText(kind)) if kind else 0)

    def _choose_rerun(self) -> None:
        folder = self.results_dir if self.results_dir is not None else default_results_dir()
        path, _ = QFileDialog.getOpenFileName(
            self, "Rerun a saved evaluation", str(folder), "Saved evaluations (*.json)"
        )
        if path:
            self.rerun(Path(path))

    def _launch(self, work: Callable[[Task], Finished], message: str) -> None:
        self.banner.clear()
        self.progress.setValue(0)
        self.summary.setText(message)
        self.run_button.setEnabled(False)
        self.rerun_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.task = self.host.tasks.run(
            "evaluate", work, self._succeeded, self._failed, self._progressed, self._ended
        )

    def stop(self) -> None:
        """Cancel the run (its requests are aborted in the engine)."""
        if self.task is not None:
            self.task.cancel()

    def _progressed(self, fraction: float, message: str) -> None:
        self.progress.setValue(round(fraction * 1000))
        self.progress.setFormat(message)

    def _succeeded(self, finished: Finished) -> None:
        self.show_results(finished.results)
        self.saved = finished.saved
        recorded = (
            f"; scores recorded in the library for {', '.join(finished.recorded)}"
            if finished.recorded
            else ""
        )
        again = ""
        if finished.rerun is not None:
            changed = changed_cells(finished.rerun.saved, finished.results)
            total = len(finished.results.cells)
            again = f"Rerun: {total - changed} of {total} cells as saved. "
        self.summary.setText(f"{again}Saved {finished.saved}{recorded}.")
        if finished.warnings:
            self.banner.show_message("Rerun: " + "; ".join(finished.warnings) + ".", "warning")
        self.refresh_recent()

    def _failed(self, message: str) -> None:
        if self.task is not None and self.task.cancelled:
            self.banner.show_message("The evaluation was cancelled.", "info")
            self.summary.setText("")
        else:
            self.banner.show_message(message)

    def _ended(self) -> None:
        self.task = None
        self.run_button.setEnabled(True)
        self.rerun_button.setEnabled(True)
        self.cancel_button.setEnabled(False)
        self.runFinished.emit()

    # ---------------------------------------------------------------- results

    def show_results(self, results: EvalResults) -> None:
        self.results = results
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
        if self.results is None:
            raise ValueError("run an evaluation first")
        return write_export(self.results, Path(path))

    def _save(self, kind: str, suffix: str) -> None:
        name = f"{self.results.prompt_set if self.results else 'evaluation'}{suffix}"
        path, _ = QFileDialog.getSaveFileName(self, "Export the evaluation", name, f"{kind} (*{suffix})")
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
        return [self.path, self.adapters, self.base_picker, self.max_tokens, self.default_check, self.chat]

    def save_state(self, prefs: Preferences) -> None:
        prefs.set("evaluate/prompt_set", self.path.text())
        prefs.set("evaluate/base", self.picked_base() or self._picked or "")
        prefs.set("evaluate/adapters", sorted(self._wanted))
        prefs.set("evaluate/max_tokens", self.max_tokens.value())
        prefs.set("evaluate/default_check", self.default_check.currentText())
        prefs.set("evaluate/chat", self.chat.isChecked())

    def restore_state(self, prefs: Preferences) -> None:
        self.path.setText(prefs.get("evaluate/prompt_set", ""))
        self._picked = prefs.get("evaluate/base", "") or None
        self.set_checked(prefs.get("evaluate/adapters", [BASE]))
        self.max_tokens.setValue(prefs.get("evaluate/max_tokens", EvalSettings().max_tokens))
        check = prefs.get("evaluate/default_check", DEFAULT_CHECKS[0])
        self.default_check.setCurrentIndex(max(0, self.default_check.findText(check)))
        self.chat.setChecked(prefs.get("evaluate/chat", False))
