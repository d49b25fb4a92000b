"""The runner on a real engine: its matrix is what the engine generates, its scores what score gives."""

from __future__ import annotations

import threading
import time

import pytest

from multilora_studio.engine import SamplingParams
from multilora_studio.evaluate import BASE, EvalCancelled, EvalSettings, load_prompt_set, run_eval
from tests.evaluate.conftest import ADAPTERS, write_jsonl
from tests.waiting import wait_until

NAMES = [*ADAPTERS, BASE]
ROWS = [
    {"prompt": "Once upon a time", "reference": " there was a king", "check": "contains"},
    {"messages": [{"role": "user", "content": "Name a colour."}], "reference": "Blue."},
    {"prompt": "The capital of France is", "reference": " Paris",
     "check": {"type": "choice", "choices": [" Paris", " Rome", " Berlin"]}},
    {"prompt": "Write JSON:", "check": {"type": "json_schema", "schema": {"type": "object"}}},
    {"prompt": "Count: one, two,", "check": {"type": "regex", "pattern": "three|four"}},
]  # fmt: skip


@pytest.fixture(scope="module")
def prompt_set(tmp_path_factory):
    return load_prompt_set(write_jsonl(tmp_path_factory.mktemp("sets") / "mine.jsonl", ROWS))


@pytest.fixture(scope="module")
def results(engine, prompt_set):
    return run_eval(engine, prompt_set, NAMES, EvalSettings(max_tokens=12, batch_prompts=2))


def test_the_matrix_equals_each_cell_generated_alone(engine, prompt_set, results):
    params = SamplingParams(max_tokens=12, temperature=0.0)
    assert results.adapters == NAMES
    assert len(results.cells) == len(ROWS) * len(NAMES)
    for index, case in enumerate(prompt_set.cases):
        for name in NAMES:
            (alone,) = engine.generate([case.prompt], [None if name == BASE else name], params)
            cell = results.cell(index, name)
            assert (cell.output, cell.tokens, cell.finish_reason) == (
                alone.text,
                len(alone.token_ids),
                alone.finish_reason,
            ), (index, name)
    outputs = {name: [results.cell(i, name).output for i in range(len(ROWS))] for name in NAMES}
    assert len({tuple(texts) for texts in outputs.values()}) == len(NAMES)  # the adapters differ


def summed(engine, context, text, adapter):
    ids = [*engine.encode(context), *engine.tokenizer(text, add_special_tokens=False).input_ids]
    (scored,) = engine.score([ids], [adapter])
    start = len(engine.encode(context))
    return sum(entry.logprob for entry in scored.prompt_logprobs[start:]), len(ids) - start


def test_choice_is_the_continuation_with_the_highest_summed_log_probability(engine, results):
    choices = ROWS[2]["check"]["choices"]
    picks = set()
    for name in NAMES:
        adapter = None if name == BASE else name
        sums = {choice: summed(engine, ROWS[2]["prompt"], choice, adapter)[0] for choice in choices}
        cell = results.cell(2, name)
        assert cell.chosen == max(sums, key=sums.__getitem__)
        assert cell.passed is (cell.chosen == " Paris")
        assert cell.reference_logprob == pytest.approx(sums[" Paris"], abs=1e-5)
        picks.add(tuple(sorted(sums.items())))
    assert len(picks) == len(NAMES)  # each adapter scores the choices differently


def test_reference_scores_are_the_token_weighted_mean_of_engine_score(engine, results):
    for name in NAMES:
        adapter = None if name == BASE else name
        total = tokens = 0.0
        for row in (ROWS[0], ROWS[2]):
            value, count = summed(engine, row["prompt"], row["reference"], adapter)
            total, tokens = total + value, tokens + count
        chat = ROWS[1]["messages"]
        value, count = summed(engine, chat, ROWS[1]["reference"], adapter)
        total, tokens = total + value, tokens + count
        score = results.score(name)
        assert score.reference_logprob_per_token == pytest.approx(total / tokens, abs=1e-5)
        assert score.reference_logprob_per_token < 0
        assert score.prompts == len(ROWS) and score.checked == 4
        assert score.passed == sum(bool(results.cell(i, name).passed) for i in range(len(ROWS)))


def test_checks_are_applied_to_each_output(results):
    for name in NAMES:
        first = results.cell(0, name)
        assert first.passed is (" there was a king" in first.output)
        assert results.cell(1, name).passed is None  # a reference but no check
        regex = results.cell(4, name)
        assert regex.passed is ("three" in regex.output or "four" in regex.output)


def test_progress_reaches_one_and_cancel_stops_the_run(engine, prompt_set):
    seen = []
    run_eval(engine, prompt_set, [BASE], EvalSettings(max_tokens=2), progress=lambda f, m: seen.append(f))
    assert seen == sorted(seen) and seen[-1] == 1.0
    cancel = threading.Event()

    def stop_after_first(fraction, message):
        cancel.set()

    with pytest.raises(EvalCancelled):
        run_eval(engine, prompt_set, NAMES, EvalSettings(max_tokens=200), stop_after_first, cancel)
    idle = engine.metrics
    wait_until(lambda: idle().running == 0 and idle().waiting == 0, what="the cancelled requests to end")
    after = engine.generate(["Hello"], [None], SamplingParams(max_tokens=3, ignore_eos=True))
    assert len(after[0].token_ids) == 3  # the engine still serves


def test_unknown_adapters_and_too_long_rows_are_refused_clearly(engine, prompt_set, tmp_path):
    with pytest.raises(ValueError, match="unknown adapters nope"):
        run_eval(engine, prompt_set, ["nope", BASE])
    long = load_prompt_set(
        write_jsonl(tmp_path / "long.jsonl", [{"prompt": "hi"}, {"prompt": "word " * 300}])
    )
    with pytest.raises(ValueError, match="row 2: the prompt has"):
        run_eval(engine, long, [BASE])


def test_adapters_and_the_base_share_the_steps_of_a_batch(engine, prompt_set):
    since = time.perf_counter()
    run_eval(engine, prompt_set, NAMES, EvalSettings(max_tokens=6, batch_prompts=len(ROWS)))
    steps = engine.step_trace.snapshot(since)
    assert steps
    mixed = [s for s in steps if 0 < s.lora_sequences < s.sequences]  # adapter rows next to base rows
    assert mixed, [(s.sequences, s.lora_sequences) for s in steps]
    assert max(s.sequences for s in steps) >= len(NAMES) * 2  # several prompts x every adapter at once


def test_choices_of_a_long_question_reuse_its_context_and_score_as_computed_whole(engine, tmp_path):
    question = (
        "Read the log and answer. The keeper lit the lamp at dusk, logged a storm from the west, "
        "saw two fishing boats come home before midnight and one cargo ship pass at dawn. "
        "How many boats came home before midnight? Answer:"
    )
    choices = [" two", " one", " three", " none"]
    rows = [{"prompt": question, "reference": " two", "check": {"type": "choice", "choices": choices}}]
    prompt_set = load_prompt_set(write_jsonl(tmp_path / "long.jsonl", rows))
    before = engine.metrics(fresh=True).prefix_cache_hit_tokens
    results = run_eval(engine, prompt_set, NAMES, EvalSettings(max_tokens=4))
    context_blocks = len(engine.encode(question)) // engine.config.block_size
    hits = engine.metrics(fresh=True).prefix_cache_hit_tokens - before
    assert context_blocks >= 2
    # every choice of every adapter takes the context's full blocks from the cache
    assert hits >= len(NAMES) * len(choices) * context_blocks * engine.config.block_size
    for name in NAMES:
        adapter = None if name == BASE else name
        sums = {choice: summed(engine, question, choice, adapter)[0] for choice in choices}
        cell = results.cell(0, name)
        assert cell.chosen == max(sums, key=sums.__getitem__)
        assert cell.reference_logprob == pytest.approx(sums[" two"], abs=2e-4)
