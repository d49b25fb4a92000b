"""Runs view over a real engine, with a real training loop writing checkpoints while it watches:
the curves and the table fill in, the best is marked, a click on the curve opens Compare on the
base, the best, the latest and the clicked checkpoint, and *Keep the best* retires the rest."""

from __future__ import annotations

import json

from multilora_studio.run_records import BASE
from tests.gui.conftest import save_screenshot, wait_task
from tests.runs.trainer_loop import TrainerLoop

PROMPTS = [
    {"prompt": "Once upon a time", "reference": " there was a cat."},
    {"prompt": "The capital of France", "reference": " is Paris."},
    {"prompt": "Two plus", "reference": " two is four."},
]
TIMEOUT_MS = 120_000


def test_runs_view_follows_a_run_in_progress(qtbot, open_window, registry, tiny_model_dir, tmp_path):
    window = open_window()
    view = window.runs
    view.follow.timer.setInterval(50)
    window.show_page("Runs")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(row) + "\n" for row in PROMPTS))
    out = tmp_path / "run-out"
    out.mkdir()
    trainer = TrainerLoop(tiny_model_dir, out, max_steps=6, save_steps=2, learning_rate=5e-2).start()
    view.watch_form.folder.setText(str(out))
    view.watch_form.name.setText("gui-run")
    view.watch_form.prompts.setText(str(prompts))
    wait_task(qtbot, view.watch())

    def caught_up() -> bool:
        checkpoints = registry.checkpoints("gui-run")
        return (
            not trainer.is_alive()
            and len(checkpoints) == 3
            and all(c.scores is not None for c in checkpoints)
            and view.table.rowCount() == 3
            and view.board.best is not None
            and not view.reading
        )

    qtbot.waitUntil(caught_up, timeout=TIMEOUT_MS)
    steps, _ = view.plot.score_curve.getData()
    assert list(steps) == [2.0, 4.0, 6.0]
    loss_steps, _ = view.plot.loss_curve.getData()
    assert list(loss_steps) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    best = view.board.best
    assert best is not None and best.checkpoint.adapter == registry.get("gui-run@best").name
    marker_x, _ = view.plot.best_marker.getData()
    assert list(marker_x) == [float(best.checkpoint.step)]
    notes = [view.table.item(row, 5).text() for row in range(3)]
    assert "latest" in notes[2] and sum("best" in note for note in notes) == 1
    assert "best gui-run@step-" in view.summary.text()
    save_screenshot(window, "runs")

    view.clicked_step(4.3)  # a click on the curve near step 4
    assert window.page == "Compare"
    ticked = window.compare.checked_names()
    assert ticked[0] == BASE and {"gui-run@step-4", "gui-run@step-6", best.checkpoint.adapter} <= set(ticked)

    window.show_page("Runs")
    wait_task(qtbot, view.keep_best(), TIMEOUT_MS)
    states = {c.adapter: registry.get(c.adapter).state for c in registry.checkpoints("gui-run")}
    assert states.pop(best.checkpoint.adapter) == "active" and set(states.values()) == {"retired"}


def test_a_folder_that_is_not_one_is_refused_in_the_banner(qtbot, open_window, tmp_path):
    window = open_window()
    view = window.runs
    view.watch_form.folder.setText(str(tmp_path / "missing"))
    assert view.watch() is None
    assert "is not a folder" in view.banner.text
    view.watch_form.folder.setText(str(tmp_path))
    view.watch_form.prompts.setText(str(tmp_path / "nope.jsonl"))
    task = view.watch()
    wait_task(qtbot, task)
    assert "nope.jsonl" in view.banner.text
