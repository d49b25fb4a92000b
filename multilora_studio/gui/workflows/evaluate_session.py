"""Evaluate as a plain model: which prompts an evaluation runs on which base with which adapters,
a rerun of saved results, what the person is told when it ends, and the exports.

An evaluation is one task (the view runs it off the GUI thread): every prompt with every ticked
adapter in shared batches on the picked base's engine, leased (a swapped-out base is loaded first),
then the results are saved as JSON and the library records the scores of its adapters. A rerun
runs a saved evaluation again on the base with the weights it ran on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from multilora_studio.adapters.registry import Registry
from multilora_studio.deploy import BasePool
from multilora_studio.engine import ServingEngine
from multilora_studio.evaluate import (
    EvalResults,
    Rerun,
    changed_cells,
    load_prompt_set,
    read_results_json,
    recent_results,
    record_scores,
    run_eval,
    save_results,
    write_export,
)
from multilora_studio.gui.workflows.evaluate_inputs import EvaluateInputs
from multilora_studio.gui.workflows.events import Event, Field, Observable
from multilora_studio.run_records import AdapterDigests
from multilora_studio.util import ProgressCallback

RECENT_SHOWN = 10  # saved evaluations listed
NOT_READY = "The engine is not ready yet."
# ``changed`` names beside the fields: new results; the saved evaluations listed
RESULTS, RECENT = "results", "recent"

Lease = Callable[[str], AbstractContextManager[ServingEngine]]


@dataclass(frozen=True)
class Finished:
    """What a run hands back: the results, where they were saved, the adapters whose scores the
    library recorded; a rerun also the rerun and its warnings."""

    results: EvalResults
    saved: Path
    recorded: list[str]
    rerun: Rerun | None = None
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Evaluation:
    """One evaluation to run off the GUI thread: ``work(lease, report, cancel)`` (``lease(base)``
    gives the base's engine; ``report`` raises once the person cancelled; ``cancel`` is set then)."""

    message: str
    work: Callable[[Lease, ProgressCallback, threading.Event], Finished]


class EvaluateSession(Observable):
    """The inputs, the evaluation in flight (``running``), the last results and where they were saved.
    ``told(text, kind)`` carries what the person is told (an empty text: nothing now)."""

    running = Field(False)
    summary = Field("")

    def __init__(self, pools: Callable[[], BasePool | None], registry: Registry) -> None:
        super().__init__()
        self.pools = pools
        self.registry = registry
        self.inputs = EvaluateInputs(pools)
        self.told = Event()
        self.results: EvalResults | None = None
        self.saved: Path | None = None
        self.results_dir: Path | None = None  # None: evaluations/ in the user data directory
        self.digests = AdapterDigests()

    def tell(self, text: str, kind: str = "error") -> None:
        self.told.emit(text, kind)

    def recent(self) -> list[Path]:
        """The newest saved evaluations of the results folder, newest first."""
        return recent_results(self.results_dir, RECENT_SHOWN)

    # ---------------------------------------------------------------- runs

    def start(self) -> Evaluation | None:
        """An evaluation of the inputs' choices; a problem is told."""
        if self.running:
            return None
        pool, names, path = self.pools(), self.inputs.ticked(), self.inputs.prompt_set.strip()
        base = self.inputs.shown
        problem = (
            "Choose a prompt set file first."
            if not path
            else NOT_READY
            if pool is None
            else "Tick at least one adapter (or base)."
            if not names
            else None
        )
        if problem is not None or pool is None or base is None:
            self.tell(problem or NOT_READY, "warning")
            return None
        default, settings = self.inputs.check_kind(), self.inputs.settings()
        registry, folder, digests = self.registry, self.results_dir, self.digests

        def work(lease: Lease, report: ProgressCallback, cancel: threading.Event) -> Finished:
            prompt_set = load_prompt_set(Path(path), default)
            with lease(base) as engine:  # loaded if it was swapped out
                results = run_eval(engine, prompt_set, names, settings, report, cancel, digests)
            saved = save_results(results, folder)
            return Finished(results, saved, record_scores(registry, results, saved))

        on = f" (base model {base})" if len(pool.names) > 1 else ""
        return self._launch(Evaluation(f"Evaluating {Path(path).name} on {', '.join(names)}{on}…", work))

    def rerun(self, path: Path) -> Evaluation | None:
        """Run the saved evaluation ``path`` again, its inputs shown; a problem is told."""
        if self.running:
            return None
        pool = self.pools()
        if pool is None:
            self.tell(NOT_READY, "warning")
            return None
        try:
            saved = read_results_json(path)
        except (OSError, ValueError) as error:
            self.tell(f"Cannot rerun: {error}")
            return None
        base = base_with_weights(pool, saved.base_digest, saved.model)
        if base is None:
            self.tell(
                f"Cannot rerun: the evaluation ran on {saved.model} (sha256 "
                f"{saved.base_digest[:12] or 'unknown'}), which is not among the base models in Settings."
            )
            return None
        self.inputs.pick_base(base)
        self.inputs.show(saved)
        registry, folder, digests = self.registry, self.results_dir, self.digests

        def work(lease: Lease, report: ProgressCallback, cancel: threading.Event) -> Finished:
            rerun = Rerun.of(saved)
            with lease(base) as engine:  # loaded if it was swapped out
                warnings = rerun.check_engine(engine, digests)
                results = rerun.run(engine, report, cancel, digests)
            written = save_results(results, folder)
            return Finished(
                results, written, record_scores(registry, results, written), rerun, tuple(warnings)
            )

        return self._launch(Evaluation(f"Rerunning {Path(path).name} on {', '.join(saved.adapters)}…", work))

    def _launch(self, evaluation: Evaluation) -> Evaluation:
        self.tell("")
        self.summary = evaluation.message
        self.running = True
        return evaluation

    def succeeded(self, finished: Finished) -> None:
        self.results = finished.results
        self.saved = finished.saved
        self.changed.emit(RESULTS)
        recorded = (
            f"; scores recorded in the library for {', '.join(finished.recorded)}"
            if finished.recorded
            else ""
        )
        again = ""
        if finished.rerun is not None:
            total = len(finished.results.cells)
            same = total - changed_cells(finished.rerun.saved, finished.results)
            again = f"Rerun: {same} of {total} cells as saved. "
        self.summary = f"{again}Saved {finished.saved}{recorded}."
        if finished.warnings:
            self.tell("Rerun: " + "; ".join(finished.warnings) + ".", "warning")
        self.changed.emit(RECENT)

    def failed(self, message: str, cancelled: bool) -> None:
        if cancelled:
            self.tell("The evaluation was cancelled.", "info")
            self.summary = ""
        else:
            self.tell(message)

    def ended(self) -> None:
        self.running = False

    # ---------------------------------------------------------------- exports

    def export_name(self, suffix: str) -> str:
        """The file name an export is offered under."""
        return f"{self.results.prompt_set if self.results else 'evaluation'}{suffix}"

    def export(self, path: str | Path) -> Path:
        """Write the last results as CSV, JSON or Markdown (by the suffix)."""
        if self.results is None:
            raise ValueError("run an evaluation first")
        return write_export(self.results, Path(path))

    def save_export(self, path: str, suffix: str) -> None:
        """``export`` to ``path`` (``suffix`` added when missing); the outcome is told."""
        try:
            written = self.export(path if path.endswith(suffix) else path + suffix)
        except (OSError, ValueError) as error:
            self.tell(f"Could not write {path}: {error}")
        else:
            self.tell(f"Saved {written}", "success")


def base_with_weights(pool: BasePool, digest: str, name: str) -> str | None:
    """The base of ``pool`` with weights ``digest`` (an unknown digest: the base called ``name``), or None."""
    return next(
        (base for base in pool.names if (pool.base(base).digest == digest if digest else base == name)),
        None,
    )
