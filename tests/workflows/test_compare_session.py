"""Compare's chat as a plain model over a real engine (no window): what a send, a follow-up, an edit
and a rerun send, what a finished send records and exports, what a failed one restores, and which
answers a divergence scoring explains."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from multilora_studio.engine import RequestOutput
from multilora_studio.gui.workflows.compare_inputs import TOKENS
from multilora_studio.gui.workflows.compare_record import Sending
from multilora_studio.gui.workflows.compare_requests import ColumnUpdate, prompt_counts
from multilora_studio.gui.workflows.compare_session import COLUMNS, NOT_READY, CompareSession
from multilora_studio.run_records import ColumnOverrides, EngineRecord, RunHistory, RunRecord

SYSTEM = "You are a terse assistant."
FIRST, SECOND, EDITED = "Name a colour.", "Why that one?", "Name a fruit."
NAMES = ["base", "tiny-r4-qv", "tiny-r8-all"]
TOKENS_EACH = 6


@pytest.fixture
def session(pool, registry, tmp_path) -> CompareSession:
    session = CompareSession(lambda: pool, registry, RunHistory(tmp_path / "runs"))
    session.choices.choose(NAMES)
    session.inputs.system_prompt = SYSTEM
    session.inputs.max_tokens = TOKENS_EACH
    session.inputs.ignore_eos = True
    return session


def told(session: CompareSession) -> list[tuple[str, str]]:
    heard: list[tuple[str, str]] = []
    session.told.connect(lambda text, kind: heard.append((text, kind)))
    return heard


def run(session: CompareSession, sending: Sending | None) -> list[RequestOutput]:
    """Run ``sending`` on its bases' engines as the view does (one batch per base) and hand the
    session each column's whole answer."""
    assert sending is not None
    outputs: dict[int, RequestOutput] = {}
    engines = {}
    for base in sending.bases:
        with sending.pool.lease(base) as engine:
            engines[base] = EngineRecord.of(engine)
            group = [(i, r) for i, r in enumerate(sending.requests) if r.base == base]
            done = engine.generate(
                [r.prompt for _, r in group],
                [r.adapter for _, r in group],
                [r.engine_params for _, r in group],
            )
            outputs.update((i, output) for (i, _), output in zip(group, done, strict=True))
    ordered = [outputs[i] for i in range(len(sending.requests))]
    updates = [
        ColumnUpdate(
            o.text, len(o.token_ids), o.ttft, o.queue_time, o.tokens_per_second, True, o, *prompt_counts(o)
        )
        for o in ordered
    ]
    session.finish(updates, engines, session.side_work(sending)())
    return ordered


def chat(*turns: dict) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, *turns]


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def test_a_new_chat_asks_every_ticked_column_and_its_end_is_recorded(session, pool):
    sending = session.start()
    assert sending is not None and session.running and not session.can_follow_up
    assert [r.name for r in sending.requests] == NAMES
    assert [r.adapter for r in sending.requests] == [None, "tiny-r4-qv", "tiny-r8-all"]
    assert [r.prompt for r in sending.requests] == [chat(user(session.inputs.message))] * 3
    seeds = {r.params.seed for r in sending.requests}
    assert len(seeds) == 1 and None not in seeds  # one seed drawn for the send, recorded
    assert session.summary == f"3 requests in one batch on {pool.primary}…"
    assert session.start() is None  # one send at a time

    outputs = run(session, sending)
    assert [a.text for a in session.answers] == [o.text for o in outputs]
    assert session.conversation is not None and session.conversation.answers == [[o.text] for o in outputs]
    assert session.summary == f"3 answers, {3 * TOKENS_EACH} tokens in one batched run"
    assert session.can_follow_up and session.can_edit and session.can_export
    record = session.history.records()[0]
    assert [list(c.output.token_ids) for c in record.columns] == [o.token_ids for o in outputs]
    assert record.columns[1].adapter_digest is not None and record.shared.seed in seeds
    base = outputs[0].text
    for answer, output in zip(session.answers[1:], outputs[1:], strict=True):
        common = next((i for i, (a, b) in enumerate(zip(base, output.text, strict=False)) if a != b), None)
        assert answer.diverges_at == (common if common is not None else min(len(base), len(output.text)))
        assert (
            session.comparison is not None
            and session.comparison.differs_from_base_at[answer.name] == answer.diverges_at
        )


def test_a_follow_up_asks_each_column_with_its_own_history_and_an_edit_resends_from_a_turn(session):
    session.inputs.message = FIRST
    first = run(session, session.start())
    answers = list(session.answers)
    columns: list[str] = []
    session.changed.connect(columns.append)
    session.inputs.message = SECOND
    sending = session.follow_up()
    assert sending is not None
    assert [r.prompt for r in sending.requests] == [
        chat(user(FIRST), {"role": "assistant", "content": o.text}, user(SECOND)) for o in first
    ]
    second = run(session, sending)
    assert session.answers == answers and COLUMNS not in columns  # the same columns go on
    assert [a.history for a in session.answers] == [[(FIRST, o.text)] for o in first]
    assert session.turn_labels() == [f"1. {FIRST}", f"2. {SECOND}"]
    assert session.conversation is not None and session.conversation.answers[2] == [
        first[2].text,
        second[2].text,
    ]

    heard = told(session)
    assert not session.edit_turn(5) and heard == [("Pick a turn of the chat to edit.", "info")]
    assert session.edit_turn(0) and session.editing == 0 and session.inputs.message == FIRST
    session.inputs.message = EDITED
    sending = session.start()
    assert sending is not None and session.editing is None
    assert [r.prompt for r in sending.requests] == [chat(user(EDITED))] * 3
    run(session, sending)
    assert session.turn_labels() == [f"1. {EDITED}"] and all(a.history == [] for a in session.answers)
    assert len(session.history.records()) == 3


def test_a_follow_up_takes_the_chats_start_from_the_prefix_cache(session, pool):
    session.inputs.system_prompt = "You answer in riddles about the sea and never in plain words."  # new here
    session.inputs.message = FIRST
    first = run(session, session.start())
    assert [a.cached_tokens for a in session.answers] == [0, 0, 0]
    session.inputs.message = SECOND
    second = run(session, session.follow_up())
    block = pool.base(pool.primary).config.block_size
    for answer, before, after in zip(session.answers, first, second, strict=True):
        assert answer.prompt_tokens == len(after.prompt_token_ids) > len(before.prompt_token_ids)
        # at least the first turn's whole blocks of prompt: its system prompt and user message
        assert (
            answer.cached_tokens
            == after.num_cached_tokens
            >= len(before.prompt_token_ids) // block * block
            > 0
        )
        assert f"prompt {answer.prompt_tokens} tok ({answer.cached_tokens} cached)" in answer.stats()


def test_refusals_are_told_and_send_nothing(session, pool, registry):
    heard = told(session)
    session.choices.tick([])
    assert session.start() is None
    session.choices.tick(NAMES)
    session.inputs.message = "   "
    assert session.start() is None
    session.inputs.message = FIRST
    session.inputs.stop = "a\\q"
    assert session.start() is None
    session.inputs.stop = ""
    assert [kind for _, kind in heard] == ["warning", "warning", "error"]
    assert heard[0][0] == "Tick at least one adapter or the base model."
    assert heard[1][0] == "Type a prompt first." and "unknown escape" in heard[2][0]
    assert session.conversation is None and not session.running

    session.inputs.raw = True
    run(session, session.start())
    assert not session.can_follow_up and session.follow_up() is None
    assert heard[-1] == ("A raw prompt has no turns: untick Raw prompt and Run a new chat.", "warning")
    no_engine = CompareSession(lambda: None, registry)
    assert no_engine.choices.ticked() == []  # nothing is listed while no engine runs
    no_engine.told.connect(lambda text, kind: heard.append((text, kind)))
    assert no_engine.rerun(session.history.records()[0]) is None and heard[-1] == (NOT_READY, "warning")


def test_a_failed_send_leaves_the_chat_as_it_was(session):
    session.inputs.message = FIRST
    first = run(session, session.start())
    session.inputs.message = SECOND
    assert session.follow_up() is not None
    session.new_chat()  # ignored while a send runs
    assert session.running and session.answers[0].text == ""
    heard = told(session)
    session.fail("the engine stopped")
    assert heard == [("the engine stopped", "error")] and not session.running and session.summary == ""
    assert session.conversation is not None and session.conversation.user_turns == [FIRST]
    assert [a.text for a in session.answers] == [o.text for o in first]
    assert [a.user_text for a in session.answers] == [FIRST] * 3
    session.new_chat()
    assert session.conversation is None and session.answers == [] and not session.can_edit


def test_own_settings_reach_only_their_column(session):
    own = ColumnOverrides(temperature=0.8, max_tokens=2, seed=11)
    session.set_column_overrides("tiny-r4-qv", own)
    sending = session.start()
    assert sending is not None
    params = {r.name: r.params for r in sending.requests}
    assert (params["tiny-r4-qv"].max_tokens, params["tiny-r4-qv"].temperature, params["tiny-r4-qv"].seed) == (
        2,
        0.8,
        11,
    )
    assert params["base"].max_tokens == params["tiny-r8-all"].max_tokens == TOKENS_EACH
    assert [a.overrides for a in session.answers] == [ColumnOverrides(), own, ColumnOverrides()]
    run(session, sending)
    assert [a.tokens for a in session.answers] == [TOKENS_EACH, 2, TOKENS_EACH]
    assert session.history.records()[0].columns[1].overrides == own


def test_exports_carry_the_run_record(session, tmp_path):
    with pytest.raises(ValueError, match="run a comparison first"):
        session.export(tmp_path / "early.json")
    assert session.copy_markdown() is None
    run(session, session.start())
    record = session.history.records()[0]
    assert RunRecord.from_dict(json.loads(session.export(tmp_path / "run.json").read_text())) == record
    heard = told(session)
    session.save_export(str(tmp_path / "run"), ".md")
    markdown = (tmp_path / "run.md").read_text()
    assert heard == [(f"Saved {tmp_path / 'run.md'}", "success")] and "## tiny-r8-all" in markdown
    assert session.copy_markdown() == markdown and session.summary == "Markdown copied to the clipboard"
    session.save_export(str(tmp_path / "missing" / "run.md"), ".md")
    assert heard[-1][0].startswith("Could not write") and heard[-1][1] == "error"


def test_a_rerun_restores_the_inputs_and_sends_what_was_recorded(session, pool, registry, tmp_path):
    session.inputs.message = FIRST
    session.set_column_overrides("tiny-r8-all", ColumnOverrides(max_tokens=3))
    first = run(session, session.start())
    record = session.history.records()[0]

    again = CompareSession(lambda: pool, registry, RunHistory(tmp_path / "again"))
    heard = told(again)
    sending = again.rerun(record)
    assert sending is not None and heard == [("", "error")]  # the banner cleared, nothing to warn of
    assert (again.inputs.system_prompt, again.inputs.message, again.inputs.max_tokens) == (
        SYSTEM,
        FIRST,
        TOKENS_EACH,
    )
    assert again.inputs.seed == record.shared.seed and again.choices.ticked() == NAMES
    assert again.choices.own_settings("tiny-r8-all") == ColumnOverrides(max_tokens=3)
    assert [r.prompt for r in sending.requests] == [c.prompt for c in record.columns]
    assert [r.params for r in sending.requests] == [c.settings.sampling_params() for c in record.columns]
    assert [o.token_ids for o in run(again, sending)] == [o.token_ids for o in first]

    gone = replace(
        record, columns=(*record.columns[:2], replace(record.columns[2], name="gone", adapter="gone"))
    )
    assert again.rerun(gone) is None and heard[-1] == (
        "Cannot rerun: the engine does not serve gone.",
        "error",
    )
    moved = replace(record, engine=replace(record.engine, model_digest="00" * 32))
    run(again, again.rerun(moved))
    assert (
        heard[-1][1] == "warning"
        and "answers may differ" in heard[-1][0]
        and "sha256 000000000000" in heard[-1][0]
    )


def test_divergence_is_scored_for_the_adapter_columns_shown_as_tokens(session, pool):
    outputs = run(session, session.start())
    assert not session.divergence_due()
    session.inputs.view = TOKENS
    assert session.divergence_due()
    scoring = session.score_divergence()
    assert scoring is not None and session.divergence_busy and session.score_divergence() is None
    assert [index for index, _, _ in scoring.wanted] == [1, 2]
    assert session.summary == "scoring 2 answers under their adapters and the base…"
    scored = scoring.score(pool.lease)
    assert session.show_divergence(scoring, scored) and not session.divergence_busy
    with pool.lease(pool.primary) as engine:
        for answer, output in zip(session.answers[1:], outputs[1:], strict=True):
            assert answer.divergence is not None
            assert [t.token_id for t in answer.divergence] == output.token_ids
            ids = [*output.prompt_token_ids, *output.token_ids]
            under = engine.score([ids], [answer.name], 5)[0].prompt_logprobs
            start = len(output.prompt_token_ids)
            assert answer.divergence[0].logprob == pytest.approx(under[start].logprob, abs=1e-4)
    assert not session.divergence_due()

    stale = session.score_divergence()
    assert stale is not None
    run(session, session.start())  # a newer run replaces the answers the scoring explains
    assert not session.show_divergence(stale, stale.score(pool.lease))


def test_what_the_inputs_say_and_remember(session, store):
    settings = session.inputs.shared_settings()
    assert settings.seed is not None and settings.max_tokens == TOKENS_EACH and settings.ignore_eos
    session.inputs.seed = 7
    session.inputs.stop = "END,\\n"
    assert session.inputs.shared_settings().seed == 7 and session.inputs.shared_settings().stop == (
        "END",
        "\n",
    )
    session.save_state(store)
    again = CompareSession(session.pools, session.registry)
    again.restore_state(store)
    for name in ("system_prompt", "message", "max_tokens", "seed", "stop", "ignore_eos", "view"):
        assert getattr(again.inputs, name) == getattr(session.inputs, name), name
    assert again.choices.ticked() == NAMES
    again.inputs.show_shared_settings(replace(settings, seed=None, stop=(",",)))
    assert again.inputs.seed == -1 and again.inputs.stop == "\\,"
