"""Evaluate as a plain model over a real engine (no window): which adapters of which base an
evaluation runs, what it refuses, what a rerun restores and reproduces, what the person is told,
the exports and what is remembered."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from multilora_studio.deploy import BasePool
from multilora_studio.evaluate import BASE, read_results_json
from multilora_studio.gui.workflows.evaluate_inputs import DEFAULT_CHECKS, ENTRIES, EvaluateInputs
from multilora_studio.gui.workflows.evaluate_session import (
    NOT_READY,
    RECENT,
    RESULTS,
    EvaluateSession,
    Evaluation,
    Finished,
    base_with_weights,
)
from tests.workflows.conftest import ADAPTERS

ROWS = [
    {"prompt": "Once upon a time", "reference": " there"},
    {"prompt": "The sky is", "reference": " blue", "check": {"type": "choice", "choices": [" blue", " red"]}},
]


@pytest.fixture
def prompt_file(tmp_path) -> Path:
    path = tmp_path / "my-prompts.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return path


@pytest.fixture
def session(pool, registry, tmp_path, prompt_file) -> EvaluateSession:
    session = EvaluateSession(lambda: pool, registry)
    session.results_dir = tmp_path / "runs"
    session.inputs.relist()
    session.inputs.prompt_set = str(prompt_file)
    session.inputs.tick([BASE, ADAPTERS[0]])
    session.inputs.max_tokens = 4
    return session


def told(session: EvaluateSession) -> list[tuple[str, str]]:
    heard: list[tuple[str, str]] = []
    session.told.connect(lambda text, kind: heard.append((text, kind)))
    return heard


def run(session: EvaluateSession, evaluation: Evaluation | None, pool: BasePool) -> Finished:
    """Run ``evaluation`` as the view's task does, and hand the session what it finished with."""
    assert evaluation is not None and session.running
    reports: list[float] = []
    finished = evaluation.work(
        pool.lease, lambda fraction, message: reports.append(fraction), threading.Event()
    )
    assert reports and reports[-1] == pytest.approx(1.0)
    session.succeeded(finished)
    session.ended()
    return finished


def test_the_picked_bases_adapters_are_listed_and_a_pick_waits_for_its_base(two_bases):
    served: list[BasePool | None] = [None]
    inputs = EvaluateInputs(lambda: served[0])
    inputs.picked = "tiny-copy"  # remembered from an earlier session, before the engine runs
    inputs.relist()
    assert inputs.shown is None and inputs.listed() == []
    served[0] = two_bases
    seen: list[str] = []
    inputs.changed.connect(seen.append)
    inputs.relist()
    assert seen == [ENTRIES] and inputs.shown == "tiny-copy" and inputs.listed() == [BASE, "tiny-r8-attn"]
    inputs.tick([BASE, "tiny-r8-attn"])
    assert inputs.pick_base(two_bases.primary) and not inputs.pick_base("no-such-base")
    assert inputs.listed() == [BASE, *sorted(ADAPTERS)] and inputs.ticked() == [BASE]
    inputs.tick_all(True)
    assert inputs.ticked() == [BASE, *sorted(ADAPTERS)]
    inputs.pick_base("tiny-copy")
    assert inputs.ticked() == [BASE, "tiny-r8-attn"]  # its tick survived the other base's listing
    inputs.tick_all(False)
    assert inputs.ticked() == [] and inputs.wanted == set(ADAPTERS)


def test_refusals_are_told_and_run_nothing(session, pool, registry, tmp_path):
    heard = told(session)
    session.inputs.prompt_set = "  "
    assert session.start() is None
    session.inputs.prompt_set = "prompts.jsonl"
    session.inputs.tick([])
    assert session.start() is None
    assert session.rerun(tmp_path / "missing.json") is None
    assert heard[:2] == [
        ("Choose a prompt set file first.", "warning"),
        ("Tick at least one adapter (or base).", "warning"),
    ]
    assert heard[2][0].startswith("Cannot rerun:") and "missing.json" in heard[2][0]
    no_engine = EvaluateSession(lambda: None, registry)
    no_engine.told.connect(lambda text, kind: heard.append((text, kind)))
    no_engine.inputs.prompt_set = "prompts.jsonl"
    assert no_engine.start() is None and no_engine.rerun(tmp_path / "any.json") is None
    assert heard[3:] == [(NOT_READY, "warning")] * 2
    assert not session.running and not no_engine.running


def test_an_evaluation_runs_every_prompt_with_every_ticked_adapter_and_is_saved(session, pool, prompt_file):
    session.inputs.default_check = "contains"
    seen: list[str] = []
    session.changed.connect(seen.append)
    evaluation = session.start()
    assert (
        evaluation is not None
        and evaluation.message == f"Evaluating my-prompts.jsonl on base, {ADAPTERS[0]}…"
    )
    assert session.summary == evaluation.message and session.start() is None  # one evaluation at a time
    finished = run(session, evaluation, pool)
    results = finished.results
    assert results.adapters == [BASE, ADAPTERS[0]] and len(results.cells) == len(ROWS) * 2
    assert results.cells[0].passed is not None  # the default check "contains" judged the first row
    with pool.lease(pool.primary) as engine:
        (alone,) = engine.generate(
            [ROWS[0]["prompt"]], [ADAPTERS[0]], session.inputs.settings().sampling_params()
        )
    assert results.cell(0, ADAPTERS[0]).output == alone.text
    assert session.results is results and read_results_json(finished.saved) == results
    assert session.summary == f"Saved {finished.saved}."  # no library adapter: no scores recorded
    assert session.recent() == [finished.saved] and RESULTS in seen and RECENT in seen
    assert not session.running and seen[-1] == "running"


def test_a_rerun_shows_what_it_ran_and_reproduces_its_cells(session, pool, registry, prompt_file, tmp_path):
    first = run(session, session.start(), pool)
    again = EvaluateSession(lambda: pool, registry)
    again.results_dir = tmp_path / "again"
    heard = told(again)
    evaluation = again.rerun(first.saved)
    assert evaluation is not None and heard == [("", "error")]
    inputs = again.inputs
    assert (inputs.prompt_set, inputs.ticked(), inputs.max_tokens) == (
        str(prompt_file.resolve()),
        [BASE, ADAPTERS[0]],
        4,
    )
    assert inputs.default_check == DEFAULT_CHECKS[0] and inputs.shown == pool.primary
    finished = run(again, evaluation, pool)
    total = len(first.results.cells)
    assert finished.results.cells == first.results.cells
    assert again.summary.startswith(f"Rerun: {total} of {total} cells as saved. Saved ")

    prompt_file.write_text(prompt_file.read_text() + json.dumps({"prompt": "One more"}) + "\n")
    changed = again.rerun(first.saved)
    assert changed is not None
    with pytest.raises(ValueError, match="changed since the evaluation"):
        changed.work(pool.lease, lambda fraction, message: None, threading.Event())


def test_a_run_that_fails_or_is_cancelled_is_told_and_the_exports_need_results(session, tmp_path):
    heard = told(session)
    session.summary = "Evaluating…"
    session.failed("my-prompts.jsonl, row 2: unknown check 'fuzzy'", cancelled=False)
    session.failed("cancelled", cancelled=True)
    assert heard == [
        ("my-prompts.jsonl, row 2: unknown check 'fuzzy'", "error"),
        ("The evaluation was cancelled.", "info"),
    ]
    assert session.summary == ""
    with pytest.raises(ValueError, match="run an evaluation first"):
        session.export(tmp_path / "out.csv")
    assert session.export_name(".csv") == "evaluation.csv"
    session.save_export(str(tmp_path / "out"), ".csv")
    assert heard[-1] == (f"Could not write {tmp_path / 'out'}: run an evaluation first", "error")


def test_exports_and_what_is_remembered(session, pool, store, registry):
    finished = run(session, session.start(), pool)
    heard = told(session)
    assert session.export_name(".md") == "my-prompts.md"
    session.save_export(str(session.results_dir / "out"), ".json")
    assert read_results_json(session.results_dir / "out.json") == finished.results
    assert heard == [(f"Saved {session.results_dir / 'out.json'}", "success")]

    session.inputs.chat = True
    session.inputs.default_check = "exact"
    session.inputs.save(store)
    assert store["evaluate/base"] == pool.primary and store["evaluate/adapters"] == [BASE, ADAPTERS[0]]
    again = EvaluateSession(lambda: pool, registry)
    again.inputs.restore(store)
    for name in ("prompt_set", "max_tokens", "chat", "default_check", "shown"):
        assert getattr(again.inputs, name) == getattr(session.inputs, name), name
    store["evaluate/default_check"] = "fuzzy"
    again.inputs.restore(store)
    assert again.inputs.default_check == DEFAULT_CHECKS[0] and again.inputs.check_kind() is None


def test_a_saved_evaluation_runs_again_on_the_base_with_its_weights(two_bases):
    primary, digest = two_bases.primary, two_bases.base(two_bases.primary).digest
    assert two_bases.base("tiny-copy").digest == digest  # a copy: the same weights under another name
    assert base_with_weights(two_bases, digest, "tiny-copy") == primary  # the weights decide, not the name
    assert base_with_weights(two_bases, "", "tiny-copy") == "tiny-copy"  # no digest recorded: by its name
    assert base_with_weights(two_bases, "00" * 32, primary) is None
