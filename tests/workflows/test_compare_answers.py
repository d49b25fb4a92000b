"""A Compare column's answer as plain state: streaming, finishing, where it leaves the base's answer,
its numbers line (with its prompt's cached tokens), and what it announces."""

from __future__ import annotations

from multilora_studio.engine import RequestOutput
from multilora_studio.gui.workflows.compare_answers import (
    COUNTED,
    DEPARTED,
    DIVERGED,
    FAILED,
    FINISHED,
    GREW,
    QUIET,
    SAME,
    TURN,
    AnswerState,
    check_differences,
    overrides_label,
)
from multilora_studio.gui.workflows.compare_requests import ColumnUpdate, prompt_counts
from multilora_studio.run_records import ColumnOverrides


def streamed(text: str, tokens: int) -> ColumnUpdate:
    return ColumnUpdate(text, tokens, 0.25, 0.01, 40.0, False, None)


def finished(text: str, error: str | None = None) -> ColumnUpdate:
    reason = "error" if error else "length"
    output = RequestOutput("request", None, [7], [1, 2, 3], text, finish_reason=reason, error=error)
    return ColumnUpdate("", 3, 0.25, 0.01, 40.0, True, output)


def test_an_answer_streams_then_takes_the_final_text_and_says_how_it_ended():
    answer = AnswerState("tiny-r4-qv")
    heard: list[str] = []
    answer.changed.connect(heard.append)
    answer.begin_turn([("Hi", "Hello")], "And then?")
    answer.apply(streamed("The ", 1))
    answer.apply(streamed("", 1))
    assert answer.text == "The " and not answer.done
    assert answer.stats() == "1 tok · 40.0 tok/s · TTFT 0.25 s · queued 0.01 s"
    answer.apply(finished("The end."))
    assert heard == [TURN, GREW, COUNTED, FINISHED]
    assert answer.text == "The end." and answer.done and answer.stats().endswith("· length")
    assert answer.history == [("Hi", "Hello")] and answer.user_text == "And then?"
    assert (answer.difference, answer.difference_tone) == ("", QUIET)

    failing = AnswerState("tiny-r8-all")
    failing.apply(finished("", error="the adapter could not load"))
    assert (failing.difference, failing.difference_tone) == ("the adapter could not load", FAILED)
    assert AnswerState("base").difference == "reference"


def test_each_adapter_column_is_compared_with_its_own_bases_column_once_known():
    base, same, other, elsewhere = AnswerState("base"), AnswerState("a"), AnswerState("b"), AnswerState("c")
    answers, bases = [base, same, other, elsewhere], ["one", "one", "one", "two"]
    heard: list[str] = []
    other.changed.connect(heard.append)
    base.apply(streamed("The cat", 2))
    same.apply(streamed("The cat", 2))
    other.apply(streamed("The cat", 2))
    elsewhere.apply(streamed("A dog", 2))
    check_differences(answers, bases)
    assert same.diverges_at is other.diverges_at is None and same.agreed == 7
    other.apply(streamed(" ran", 3))  # the base may still say " ran": not known yet
    check_differences(answers, bases)
    assert other.diverges_at is None
    base.apply(finished("The cat sat"))
    check_differences(answers, bases)
    assert other.diverges_at == 8 and other.difference == "differs from base at char 8 (after 2 words)"
    assert other.difference_tone == DEPARTED and heard[-1] == DIVERGED
    same.apply(finished("The cat sat"))
    check_differences(answers, bases)
    assert same.difference == "same as base" and same.diverges_at is None
    assert (
        elsewhere.diverges_at is None and elsewhere.difference == ""
    )  # no column without an adapter on its base
    assert SAME not in heard


def test_own_settings_read_in_a_few_words():
    assert overrides_label(ColumnOverrides()) == ""
    assert overrides_label(ColumnOverrides(temperature=0.8, max_tokens=3, stop=("\n",), seed=11)) == (
        "T 0.8 · max 3 · 1 stop · seed 11"
    )


def test_the_numbers_line_says_how_many_prompt_tokens_came_from_the_prefix_cache():
    output = RequestOutput("request", "a", list(range(40)), [1, 2], "Hi", finish_reason="length")
    assert prompt_counts(output) == (40, None)  # queued: the cache is not looked up yet
    output.first_scheduled_time, output.num_cached_tokens = 1.0, 32
    assert prompt_counts(output) == (40, 32)
    assert prompt_counts(RequestOutput("failed", "a", [], finish_reason="error")) == (None, None)

    answer = AnswerState("a")
    answer.apply(ColumnUpdate("", 0, None, None, None, False, None, 40, None))
    assert answer.stats() == "0 tok · - · TTFT - · prompt 40 tok"
    answer.apply(ColumnUpdate("Hi", 2, 0.25, 0.01, 40.0, True, output, *prompt_counts(output)))
    assert (
        answer.stats()
        == "2 tok · 40.0 tok/s · TTFT 0.25 s · prompt 40 tok (32 cached) · queued 0.01 s · length"
    )
    assert (answer.prompt_tokens, answer.cached_tokens) == (40, 32)
    answer.begin_turn([], "again")
    assert answer.cached_tokens is None and "prompt" not in answer.stats()
