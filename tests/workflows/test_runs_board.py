"""The Runs view's rules without a window: curves, the best and latest, a click's checkpoint,
Compare's columns and what *Keep the best* retires."""

from __future__ import annotations

from pathlib import Path

from multilora_studio.adapters.registry_runs import CheckpointRecord, RunRecord
from multilora_studio.adapters.run_folder import LossPoint
from multilora_studio.gui.workflows.runs_board import RunsBoard
from multilora_studio.run_records import BASE


def checkpoint(id_: int, step: int, scores, present: bool = True, version: int = 1) -> CheckpointRecord:
    name = f"r@step-{step}" + ("" if version == 1 else f".v{version}")
    return CheckpointRecord(
        id_, "r", step, version, name, present, Path("f"), (), "", 1.0, 1.1,
        None if scores is None else "pass", None if scores is None else tuple(scores),
        None, False, float(id_),
    )  # fmt: skip


def board(best: str | None = "r@step-4") -> RunsBoard:
    run = RunRecord("r", Path("out"), "p.jsonl", 0.0, True, (LossPoint(1, 2.0), LossPoint(2, 1.5, 1.7)), best)
    other = RunRecord("s", Path("other"), "", 1.0, False, (), None)
    shown = RunsBoard()
    shown.show(
        [run, other],
        [
            checkpoint(1, 2, [0, 1, 0, 1]),
            checkpoint(2, 4, [1, 1, 1, 0]),
            checkpoint(3, 6, None),
            checkpoint(4, 8, [1, 0, 0, 0], present=False),
        ],
    )
    return shown


def test_curves_rows_best_and_latest():
    shown = board()
    assert shown.picked == "r"
    curves = shown.curves()
    assert curves.score_steps == [2.0, 4.0] and curves.scores == [0.5, 0.75] and curves.metric == "pass"
    assert curves.loss_steps == [1.0, 2.0] and curves.eval_loss_steps == [2.0]
    assert shown.best is not None and shown.best.checkpoint.adapter == "r@step-4" and shown.best.spread > 0
    assert shown.latest is not None and shown.latest.adapter == "r@step-6"
    notes = [row.note for row in shown.rows()]
    assert notes == ["", "best", "latest", "removed from the library"]
    assert shown.rows()[1].score.startswith("0.7500 ± ")
    assert "best r@step-4 (pass 0.7500" in shown.summary()


def test_a_click_compare_columns_and_what_keep_the_best_retires():
    shown = board()
    assert shown.checkpoint_near(7.9).adapter == "r@step-6"  # step 8 is no longer in the library
    assert shown.compare_columns() == [BASE, "r@step-4", "r@step-6"]
    assert shown.compare_columns(shown.checkpoint_near(2.2)) == [BASE, "r@step-4", "r@step-6", "r@step-2"]
    assert shown.others_than_best() == ["r@step-2", "r@step-6"]
    unscored = board(best=None)
    assert unscored.best is None and unscored.others_than_best() == ["r@step-2", "r@step-4", "r@step-6"]
    unscored.pick("s")
    assert unscored.run is not None and "no prompt set" in unscored.summary()
    unscored.pick("gone")
    assert unscored.run is None and unscored.summary().startswith("No training run")
