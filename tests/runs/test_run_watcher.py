"""The run watcher on a real training loop: each checkpoint imported once, in order, only when
whole; rotation, a restart of the run and of the watcher, refused folders."""

from __future__ import annotations

import json
import shutil
import threading
import time

import pytest

from multilora_studio.adapters.adapter_config import WEIGHTS_FILE
from multilora_studio.adapters.registry import Registry
from multilora_studio.adapters.run_folder import (
    FolderSnapshot,
    complete,
    read_trainer_state,
    scan_run,
    signature_of,
)
from multilora_studio.adapters.run_watcher import RunWatcher
from multilora_studio.util import sha256_file
from tests.runs.trainer_loop import TrainerLoop

POLL_S = 0.02


def follow(watcher: RunWatcher, trainer: threading.Thread, settle_polls: int = 3) -> list[str]:
    """Poll while the trainer runs and until nothing is left to import; the names imported."""
    names: list[str] = []
    quiet = 0
    while trainer.is_alive() or quiet < settle_polls:
        result = watcher.poll()
        names += [c.adapter for c in result.imported]
        assert not result.refused
        quiet = 0 if trainer.is_alive() or result.imported or result.waiting else quiet + 1
        time.sleep(POLL_S)
    return names


def test_every_checkpoint_once_in_order_whole_and_rotation_kept(
    registry, tiny_base, tiny_model_dir, tmp_path
):
    run_dir = tmp_path / "out"
    registry.follow_run("demo", run_dir)
    loop = TrainerLoop(tiny_model_dir, run_dir, max_steps=6, save_steps=2, save_total_limit=2)
    names = follow(RunWatcher(registry, "demo", tiny_base), loop.start())
    # the final adapter has checkpoint-6's weights: not imported a second time
    assert names == ["demo@step-2", "demo@step-4", "demo@step-6"]
    checkpoints = registry.checkpoints("demo")
    assert [(c.step, c.version, c.gone) for c in checkpoints] == [(2, 1, True), (4, 1, False), (6, 1, False)]
    assert not (run_dir / "checkpoint-2").exists() and registry.get("demo@step-2").path.is_dir()
    for checkpoint in checkpoints:  # the library's copy is the whole file the trainer finished
        assert sha256_file(registry.get(checkpoint.adapter).path / WEIGHTS_FILE) == checkpoint.weights_sha256
        assert checkpoint.train_loss is not None and checkpoint.eval_loss is not None
    assert sha256_file(run_dir / "checkpoint-6" / WEIGHTS_FILE) == checkpoints[-1].weights_sha256
    losses = registry.run("demo").losses
    assert [p.step for p in losses] == [1, 2, 3, 4, 5, 6] and losses[1].eval_loss is not None


def test_restarted_run_and_restarted_watcher(registry, tiny_base, tiny_model_dir, tmp_path):
    run_dir = tmp_path / "out"
    registry.follow_run("r", run_dir)
    first = TrainerLoop(tiny_model_dir, run_dir, max_steps=8, save_steps=2, stop_after_saves=2)
    assert follow(RunWatcher(registry, "r", tiny_base), first.start()) == ["r@step-2", "r@step-4"]
    # the window closes; the run restarts from checkpoint-2 and writes step 4 again (other weights)
    reopened = Registry(registry.root)
    again = TrainerLoop(
        tiny_model_dir, run_dir, max_steps=6, save_steps=2, seed=1, resume_from=run_dir / "checkpoint-2"
    )
    thread = again.start()
    watcher = RunWatcher(reopened, "r", tiny_base)
    assert follow(watcher, thread) == ["r@step-4.v2", "r@step-6"]
    assert [(c.step, c.version) for c in reopened.checkpoints("r")] == [(2, 1), (4, 1), (4, 2), (6, 1)]
    # the same bytes written again (new times): the same step's weights, not imported again
    weights = run_dir / "checkpoint-6" / WEIGHTS_FILE
    weights.write_bytes(weights.read_bytes())
    assert [watcher.poll().imported for _ in range(3)] == [[], [], []]
    # the final adapter saved as an earlier checkpoint's weights (load_best_model_at_end)
    shutil.copy(run_dir / "checkpoint-2" / WEIGHTS_FILE, run_dir / WEIGHTS_FILE)
    assert [watcher.poll().imported for _ in range(3)] == [[], [], []]
    assert len(reopened.checkpoints("r")) == 4


def test_follow_deletions_retires_and_a_bad_folder_is_refused_once(
    registry, tiny_base, tiny_model_dir, tmp_path
):
    run_dir = tmp_path / "out"
    registry.follow_run("d", run_dir)
    loop = TrainerLoop(tiny_model_dir, run_dir, max_steps=4, save_steps=2, piece_delay_s=0.0)
    loop.run()
    shutil.rmtree(run_dir / "checkpoint-2")
    bad = run_dir / "checkpoint-9"
    shutil.copytree(run_dir / "checkpoint-4", bad)
    config = json.loads((bad / "adapter_config.json").read_text())
    (bad / "adapter_config.json").write_text(json.dumps({**config, "target_modules": ["no_such_proj"]}))
    watcher = RunWatcher(registry, "d", tiny_base, follow_deletions=True, imports_per_poll=5)
    results = [watcher.poll() for _ in range(3)]
    assert [c.adapter for r in results for c in r.imported] == ["d@step-4"]
    assert [path for r in results for path, _ in r.refused] == [bad]  # once, not at every poll
    assert "no_such_proj" in results[1].refused[0][1]
    assert registry.find("d@step-2") is None  # deleted before it was ever imported
    shutil.rmtree(run_dir / "checkpoint-4")
    assert [c.adapter for c in watcher.poll().gone] == ["d@step-4"]
    assert registry.get("d@step-4").state == "retired"


def test_half_written_folders_are_not_complete(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "out"
    TrainerLoop(tiny_model_dir, run_dir, max_steps=2, save_steps=2, piece_delay_s=0.0).run()
    folder = run_dir / "checkpoint-2"
    state = read_trainer_state(folder / "trainer_state.json")
    assert state.global_step == 2 and state.losses[-1].eval_loss is not None

    def snapshot() -> FolderSnapshot:
        return FolderSnapshot(folder, 2, False, signature_of(folder))

    assert complete(snapshot())
    weights = (folder / WEIGHTS_FILE).read_bytes()
    (folder / WEIGHTS_FILE).write_bytes(weights[: len(weights) // 2])
    assert not complete(snapshot())
    (folder / WEIGHTS_FILE).write_bytes(weights)
    text = (folder / "trainer_state.json").read_text()
    (folder / "trainer_state.json").write_text(text[: len(text) // 2])
    assert not complete(snapshot())
    (folder / "trainer_state.json").unlink()
    assert not complete(snapshot())
    assert [s.step for s in scan_run(run_dir)] == [2, None]


def test_a_run_name_or_folder_taken(registry, tmp_path):
    registry.follow_run("one", tmp_path / "a", "set.jsonl")
    assert registry.follow_run("one", tmp_path / "a").prompt_set == "set.jsonl"  # resumed as it was
    with pytest.raises(Exception, match="already follows"):
        registry.follow_run("two", tmp_path / "a")
    with pytest.raises(Exception, match="already follows"):
        registry.follow_run("one", tmp_path / "b")


def test_two_runs_at_once_and_a_backlog_one_import_a_poll(registry, tiny_base, tiny_model_dir, tmp_path):
    from multilora_studio.runs import RunFollower

    follower = RunFollower(registry, tiny_base)  # no engine: imported and aliased only
    loops = {
        name: TrainerLoop(tiny_model_dir, tmp_path / name, max_steps=4, save_steps=2, seed=seed)
        for seed, name in enumerate(("left", "right"))
    }
    for name, loop in loops.items():
        loop.output_dir.mkdir()
        follower.follow(name, loop.output_dir)
    threads = [loop.start() for loop in loops.values()]
    while any(t.is_alive() for t in threads) or any(len(registry.checkpoints(n)) < 2 for n in loops):
        follower.poll()
        time.sleep(POLL_S)
    for name in loops:
        assert [c.adapter for c in registry.checkpoints(name)] == [f"{name}@step-2", f"{name}@step-4"]
        assert registry.get(f"{name}@latest").name == f"{name}@step-4"
    # a finished run watched late: its checkpoints one a poll, after a first look at their files
    late = tmp_path / "late"
    TrainerLoop(tiny_model_dir, late, max_steps=6, save_steps=2, piece_delay_s=0).run()
    registry.follow_run("late", late)
    watcher = RunWatcher(registry, "late", tiny_base)
    counts = [len(watcher.poll().imported) for _ in range(5)]
    assert counts == [0, 1, 1, 1, 0]
