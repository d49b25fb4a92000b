"""Runs followed on a real engine: every checkpoint scored once on the run's prompt set, the best
the one with the best mean score, and ``RUN@latest`` / ``RUN@best`` moving on a live server
without ever serving the checkpoint they named before (prefix cache on)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from multilora_studio.adapters.registry_runs import CheckpointRecord
from multilora_studio.engine import SamplingParams
from multilora_studio.runs import RunFollower, clearly_better, pick_best
from tests.runs.trainer_loop import TrainerLoop
from tests.server_fixtures import GREEDY, client

POLL_S = 0.02
PROMPTS = [
    {"prompt": "Once upon a time", "reference": " there was a cat."},
    {"prompt": "The capital of France", "reference": " is Paris."},
    {"prompt": "Two plus", "reference": " two is four."},
    {"prompt": "The sky", "reference": " is blue today."},
]
LONG_PROMPT = "The capital of France is Paris. " * 8  # several KV blocks


@pytest.fixture
def prompt_file(tmp_path: Path) -> Path:
    path = tmp_path / "run-prompts.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in PROMPTS))
    return path


@pytest.fixture
def cleanup(engine):
    """Names to take off the suite's engine after the test."""
    names: list[str] = []
    yield names
    for name in names:
        if engine.has_adapter(name):
            engine.remove_adapter(name)


def poll_until(follower: RunFollower, done, timeout_s: float = 120.0) -> list:
    updates: list = []
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "the follower did not catch up"
        updates += follower.poll()
        time.sleep(POLL_S)
    return updates


def test_each_checkpoint_scored_once_and_the_best_has_the_best_mean(
    registry, tiny_base, tiny_model_dir, engine, prompt_file, tmp_path, cleanup
):
    follower = RunFollower(registry, tiny_base, engine=engine, results_dir=tmp_path / "results")
    follower.follow("s", tmp_path / "out", prompt_file)
    trainer = TrainerLoop(
        tiny_model_dir, tmp_path / "out", max_steps=8, save_steps=2, learning_rate=5e-2
    ).start()
    updates = poll_until(
        follower,
        lambda: (
            not trainer.is_alive()
            and len(registry.checkpoints("s")) == 4
            and all(c.scores is not None for c in registry.checkpoints("s"))
        ),
    )
    cleanup += [c.adapter for c in registry.checkpoints("s")]
    scored = [name for update in updates for name in update.scored]
    assert sorted(scored, key=lambda n: int(n.split("-")[-1])) == [
        "s@step-2",
        "s@step-4",
        "s@step-6",
        "s@step-8",
    ]
    assert len(set(scored)) == len(scored)  # each once
    checkpoints = registry.checkpoints("s")
    assert all(c.metric == "logprob" and len(c.scores or ()) == len(PROMPTS) for c in checkpoints)
    for checkpoint in checkpoints:
        (recorded,) = registry.eval_scores(checkpoint.adapter)
        assert recorded.prompt_set == "run-prompts" and Path(recorded.results_path or "").is_file()
    best = registry.get("s@best").name
    assert registry.run("s").best == best
    top = max(checkpoints, key=lambda c: c.mean_score or float("-inf"))
    chosen = next(c for c in checkpoints if c.adapter == best)
    # training lowers the references' loss: the last checkpoint is far better than the first
    assert clearly_better(checkpoints[-1], checkpoints[0])
    assert chosen is top or not clearly_better(top, chosen)
    assert registry.get("s@latest").name == "s@step-8"
    assert updates[-1].best is not None and updates[-1].best.spread > 0


def test_a_new_prompt_set_or_settings_scores_the_earlier_checkpoints_again_together(
    registry, tiny_base, tiny_model_dir, engine, prompt_file, tmp_path, cleanup
):
    follower = RunFollower(registry, tiny_base, engine=engine, results_dir=tmp_path / "results")
    follower.follow("t", tmp_path / "out", prompt_file)
    TrainerLoop(tiny_model_dir, tmp_path / "out", max_steps=4, save_steps=2, learning_rate=5e-2).run()
    poll_until(
        follower,
        lambda: len(registry.checkpoints("t")) == 2 and all(c.scores for c in registry.checkpoints("t")),
    )
    cleanup += [c.adapter for c in registry.checkpoints("t")]
    first = {c.adapter: (c.scores, c.scored_with) for c in registry.checkpoints("t")}
    assert len({key for _, key in first.values()}) == 1  # one prompt set, one set of settings
    assert not any(u.scored for u in follower.poll())  # nothing left to score
    other = tmp_path / "other-prompts.jsonl"
    other.write_text("".join(json.dumps(row) + "\n" for row in PROMPTS[:2]))
    follower.follow("t", tmp_path / "out", other)  # the run scored on another prompt set
    rescored = [name for update in follower.poll() for name in update.scored]
    assert sorted(rescored) == ["t@step-2", "t@step-4"]  # both again, in one evaluation
    for checkpoint in registry.checkpoints("t"):
        assert checkpoint.scores is not None and len(checkpoint.scores) == 2
        assert checkpoint.scored_with == follower.scoring_key("t") != first[checkpoint.adapter][1]
    follower.settings = dataclasses.replace(follower.settings, max_tokens=4)  # other settings: again
    assert sorted(name for update in follower.poll() for name in update.scored) == ["t@step-2", "t@step-4"]


def checkpoint(adapter: str, step: int, scores: list[float], created: float) -> CheckpointRecord:
    return CheckpointRecord(
        0,
        "r",
        step,
        1,
        adapter,
        True,
        Path("x"),
        (),
        "",
        None,
        None,
        "pass",
        tuple(scores),
        "k",
        False,
        created,
    )


def test_better_only_beyond_the_spread():
    first = checkpoint("r@step-1", 1, [0, 0, 1, 1, 0, 1, 0, 1], 1.0)
    noisy = checkpoint("r@step-2", 2, [1, 0, 1, 1, 0, 1, 1, 0], 2.0)  # +1 of 8: within the spread
    clear = checkpoint("r@step-3", 3, [1, 1, 1, 1, 1, 1, 1, 1], 3.0)
    assert pick_best([first], None).checkpoint is first
    assert pick_best([first, noisy], first.adapter).checkpoint is first
    assert pick_best([first, noisy], None).checkpoint is noisy  # no best yet: the top mean
    picked = pick_best([first, noisy, clear], first.adapter)
    assert picked.checkpoint is clear and picked.mean == 1.0 and picked.spread == 0.0


def test_aliases_move_and_never_serve_the_checkpoint_before(
    registry, tiny_base, tiny_model_dir, engine, serve, tmp_path, cleanup
):
    assert engine.config.enable_prefix_caching
    server = serve()
    api = client(server)
    out = tmp_path / "out"
    follower = RunFollower(registry, tiny_base, engine=engine, aliases=server.pool.aliases)
    follower.follow("a", out)
    TrainerLoop(tiny_model_dir, out, max_steps=4, save_steps=2, stop_after_saves=1, piece_delay_s=0).run()
    poll_until(follower, lambda: len(registry.checkpoints("a")) == 1)
    cleanup += ["a@step-2", "a@step-4"]

    def by_alias() -> tuple[str, int]:
        reply = api.completions.create(model="a@latest", prompt=LONG_PROMPT, max_tokens=8, **GREEDY)
        return reply.choices[0].text, reply.usage.prompt_tokens_details.cached_tokens

    def direct(name: str) -> str:
        params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
        return engine.generate([LONG_PROMPT], [name], params)[0].text

    old_text, _ = by_alias()
    assert old_text == direct("a@step-2")
    again = api.completions.create(model="a@step-2", prompt=LONG_PROMPT, max_tokens=8, **GREEDY)
    assert again.usage.prompt_tokens_details.cached_tokens > 0  # the old checkpoint's KV is cached
    TrainerLoop(
        tiny_model_dir, out, max_steps=4, save_steps=2, resume_from=out / "checkpoint-2", piece_delay_s=0,
        stop_after_saves=1, learning_rate=2e-1,
    ).run()  # fmt: skip
    poll_until(follower, lambda: len(registry.checkpoints("a")) == 2)
    assert registry.get("a@latest").name == "a@step-4"
    new_text, cached = by_alias()
    assert cached == 0  # nothing of a@step-2's KV
    assert new_text == direct("a@step-4") and new_text != old_text
    assert server.pool.aliases.target("a@latest") == "a@step-4"
    # a server started after the run was imported: serve_run gives it the run's aliases
    later = serve()
    resumed = RunFollower(registry, tiny_base, engine=engine, aliases=later.pool.aliases)
    resumed.follow("a", out)
    assert resumed.serve_run("a", engine) == []  # both checkpoints are on the engine already
    reply = client(later).completions.create(model="a@latest", prompt=LONG_PROMPT, max_tokens=8, **GREEDY)
    assert reply.choices[0].text == new_text
