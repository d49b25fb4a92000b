"""Compare as a chat over a real engine: follow-ups and edits equal ``generate`` with each column's own
history, a follow-up's chat start comes from the prefix cache; per-column settings; token divergence
equals the engine's own scores; records and Rerun."""

from __future__ import annotations

import html
import json
import math

import pytest
from PySide6.QtCore import Qt

from multilora_studio.engine import SamplingParams
from multilora_studio.gui.compare_column import MARKDOWN, TOKENS, CompareColumn
from multilora_studio.gui.compare_run import ColumnUpdate
from multilora_studio.gui.compare_settings import ColumnSettingsDialog
from multilora_studio.run_records import ColumnOverrides, RunHistory, RunRecord
from multilora_studio.util import sha256_file
from tests.gui.conftest import save_screenshot

ADAPTERS = ("tiny-r4-qv", "tiny-r8-all")
SYSTEM = "You are a terse assistant."
FIRST, SECOND, EDITED = "Name a colour.", "Why that one?", "Name a fruit."
RUN_MS = 120_000


@pytest.fixture
def library(registry, tiny_base, tiny_adapters):
    for name in ADAPTERS:
        registry.import_folder(tiny_adapters[name], tiny_base, max_rank=32)
    return registry


@pytest.fixture
def compare_window(open_window, library, tmp_path):
    window = open_window()
    window.show_page("Compare")
    compare = window.compare
    compare.history = RunHistory(tmp_path / "runs")
    compare.set_checked(["base", *ADAPTERS])
    compare.system.setPlainText(SYSTEM)
    compare.raw.setChecked(False)
    compare.temperature.setValue(0.0)
    compare.ignore_eos.setChecked(False)
    compare.max_tokens.setValue(16)
    return window


def send(qtbot, compare, text, action):
    compare.prompt.setPlainText(text)
    with qtbot.waitSignal(compare.runFinished, timeout=RUN_MS):
        assert action()
    assert compare.banner.text == "", compare.banner.text


def expected_outputs(engine, histories, params):
    names = [None if c == "base" else c for c in ["base", *ADAPTERS]]
    return engine.generate(histories, names, params)


def test_follow_ups_and_edits_equal_generate_with_each_columns_own_history(qtbot, compare_window):
    compare = compare_window.compare
    engine = compare_window.host.engine
    params = SamplingParams(max_tokens=16, temperature=0.0)
    send(qtbot, compare, FIRST, compare.start)
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": FIRST}]
    turn1 = expected_outputs(engine, [first] * 3, params)
    assert [c.text for c in compare.columns] == [o.text for o in turn1]
    assert len({o.text for o in turn1}) == 3  # each adapter answers differently: histories differ
    for column, output in zip(compare.columns, turn1, strict=True):  # a new engine: nothing cached
        assert f"prompt {len(output.prompt_token_ids)} tok (0 cached)" in column.stats.text()

    send(qtbot, compare, SECOND, compare.follow_up)
    histories = [
        [*first, {"role": "assistant", "content": o.text}, {"role": "user", "content": SECOND}] for o in turn1
    ]
    turn2 = expected_outputs(engine, histories, params)
    block = engine.config.block_size
    whole_blocks = len(turn1[0].prompt_token_ids) // block * block  # of the first turn's prompt
    for column, output in zip(compare.columns, turn2, strict=True):
        assert column.output is not None and column.output.token_ids == output.token_ids, column.name
        assert column.history == [(FIRST, turn1[compare.columns.index(column)].text)]
        # the system prompt and first message (at least) come from the cache of the column's adapter
        cached = column.output.num_cached_tokens
        assert cached >= whole_blocks > 0 and column.cached_tokens == cached
        assert f"({cached} cached)" in column.stats.text()
    monitor = compare_window.monitor
    qtbot.waitUntil(
        lambda: monitor.last is not None and monitor.last.prefix_cache_hit_tokens > 0, timeout=5000
    )
    hits, looked_up = monitor.last.prefix_cache_hit_tokens, monitor.last.prefix_cache_queried_tokens
    assert f"<b>{hits / looked_up:.0%}</b> ({hits} of {looked_up} prompt tokens)" in monitor.stats.text()
    assert compare.turns.count() == 2 and compare.follow_button.isEnabled()
    save_screenshot(compare_window, "compare-chat")

    compare.edit_turn(0)
    assert compare.prompt.toPlainText() == FIRST and "Resend from turn 1" in compare.run_button.text()
    send(qtbot, compare, EDITED, compare.start)
    edited = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": EDITED}]
    again = expected_outputs(engine, [edited] * 3, params)
    assert [c.output.token_ids for c in compare.columns] == [o.token_ids for o in again]
    assert compare.conversation.user_turns == [EDITED] and all(c.history == [] for c in compare.columns)
    assert compare.turns.count() == 1 and compare.editing is None


def test_stop_strings_and_per_column_settings_reach_the_engine(qtbot, compare_window):
    compare = compare_window.compare
    engine = compare_window.host.engine
    compare.ignore_eos.setChecked(True)
    compare.max_tokens.setValue(8)
    dialog = compare.open_column_settings("tiny-r4-qv")
    dialog.max_tokens.setValue(3)
    dialog.temperature.setValue(0.8)
    dialog.seed.setValue(11)
    dialog.accept()
    assert compare.column_overrides("tiny-r4-qv") == ColumnOverrides(temperature=0.8, max_tokens=3, seed=11)
    send(qtbot, compare, FIRST, compare.start)
    chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": FIRST}]
    by_name = {c.name: c for c in compare.columns}
    assert (
        by_name["tiny-r4-qv"].tokens == 3
        and by_name["tiny-r8-all"].tokens == 8
        and by_name["base"].tokens == 8
    )
    assert "own: T 0.8 · max 3 · seed 11" in by_name["tiny-r4-qv"].overrides.text()
    sampled = engine.generate(
        [chat], ["tiny-r4-qv"], SamplingParams(max_tokens=3, temperature=0.8, seed=11, ignore_eos=True)
    )[0]
    assert by_name["tiny-r4-qv"].output.token_ids == sampled.token_ids

    base_text = by_name["base"].text
    stop = base_text[len(base_text) // 2 :][:3]  # a piece of the base's greedy answer
    assert stop.strip(" ")
    compare.stop_strings.setText(stop.replace("\\", "\\\\").replace(",", "\\,").replace("\n", "\\n"))
    send(qtbot, compare, FIRST, compare.start)
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, stop=[stop])
    expected = engine.generate([chat], [None], greedy)[0]
    base = compare.columns[0]
    assert base.text == expected.text and base.finish_reason == "stop" and stop not in base.text


def test_answers_render_as_markdown_with_code_blocks(qtbot, qapp):
    column = CompareColumn("tiny-r4-qv")
    qtbot.addWidget(column)
    text = "Some **bold** words.\n\n```python\nprint('hi')\n```\n"
    column.apply(ColumnUpdate(text, 9, 0.1, 0.01, 50.0, False, None))
    column.redraw()
    assert column.mode == MARKDOWN
    shown = column.view.toPlainText()
    assert "Some bold words." in shown and "**" not in shown and "print('hi')" in shown
    assert "```python" in column.view.document().toMarkdown()
    column.begin_turn([("Hi", "Hello *there*")], "And code?")
    column.apply(ColumnUpdate(text, 9, 0.1, 0.01, 50.0, False, None))
    column.redraw()
    shown = column.view.toPlainText()
    assert (
        shown.index("You: Hi")
        < shown.index("Hello there")
        < shown.index("You: And code?")
        < shown.index("bold")
    )


def test_token_divergence_equals_the_engines_scores(qtbot, compare_window):
    compare = compare_window.compare
    engine = compare_window.host.engine
    compare.ignore_eos.setChecked(True)
    send(qtbot, compare, FIRST, compare.start)
    with qtbot.waitSignal(compare.divergenceFinished, timeout=RUN_MS):
        compare.view_mode.setCurrentIndex(compare.view_mode.findData(TOKENS))
    assert compare.banner.text == ""
    for column in compare.columns[1:]:
        output = column.output
        ids = [*output.prompt_token_ids, *output.token_ids]
        under_adapter = engine.score([ids], [column.name], 5)[0].prompt_logprobs
        under_base = engine.score([ids], [None], 5)[0].prompt_logprobs
        start = len(output.prompt_token_ids)
        assert [t.token_id for t in column.divergence] == output.token_ids
        for offset, token in enumerate(column.divergence):
            adapter_entry, base_entry = under_adapter[start + offset], under_base[start + offset]
            assert token.delta == pytest.approx(adapter_entry.logprob - base_entry.logprob, abs=1e-4)
            assert [t for t, _ in token.top] == [t for t, _ in adapter_entry.top]
            assert [t for t, _ in token.base_top] == [t for t, _ in base_entry.top]
        assert "".join(t.text for t in column.divergence) == engine.tokenizer.decode(output.token_ids)
        assert any(abs(t.delta) > 0.01 for t in column.divergence)  # the adapter changes the distribution
        more = sum(t.delta > 0 for t in column.divergence)
        assert (
            column.divergence_note.isVisible()
            and f"{more} of {len(output.token_ids)}" in column.divergence_note.text()
        )
        first = column.divergence[0]
        tooltip = column.answer_format_at(0).toolTip()
        assert f"Δ {first.delta:+.2f}" in tooltip and "base's top" in tooltip
        for token_id, _ in (*first.top, *first.base_top):  # both top lists, each token named
            assert html.escape(repr(column.decode(token_id))) in tooltip
        color = column.answer_format_at(0).background().color()
        assert (color.green() > color.red()) == (first.delta > 0) or math.isclose(
            first.delta, 0, abs_tol=1e-3
        )
    save_screenshot(compare_window, "compare-divergence")


def test_runs_are_recorded_and_rerun_reproduces_them(qtbot, compare_window, tiny_adapters, tmp_path):
    compare = compare_window.compare
    engine = compare_window.host.engine
    send(qtbot, compare, FIRST, compare.start)
    send(qtbot, compare, SECOND, compare.follow_up)
    answers = [c.output.token_ids for c in compare.columns]
    records = compare.history.records()
    assert len(records) == 2
    record = records[0]  # the newest: the follow-up
    assert RunRecord.from_json(record.to_json()) == record
    assert record.user_turns == (FIRST, SECOND) and record.system_prompt == SYSTEM
    assert record.engine.model_digest == engine.base_digest and record.engine.max_loras == 4
    assert record.engine.dtype == "float32" and record.shared.seed is not None  # a drawn seed is recorded
    for column in record.columns[1:]:
        assert column.adapter_digest == sha256_file(tiny_adapters[column.name] / "adapter_model.safetensors")
        assert column.adapter_source == str(tiny_adapters[column.name])  # the folder it was imported from
    assert [list(c.output.token_ids) for c in record.columns] == answers
    assert json.loads(compare.export(tmp_path / "run.json").read_text())["id"] == record.id

    compare.new_chat()
    compare.set_checked(["base"])
    compare.system.clear()
    compare.max_tokens.setValue(2)
    dialog = compare.open_history()
    assert dialog.runs.count() == 2 and dialog.selected() == record
    with qtbot.waitSignal(compare.runFinished, timeout=RUN_MS):
        dialog.rerun_button.click()
    assert [c.output.token_ids for c in compare.columns] == answers
    assert compare.checked_names() == ["base", *ADAPTERS] and compare.max_tokens.value() == 16
    assert compare.system.toPlainText() == SYSTEM and compare.conversation.user_turns == [FIRST, SECOND]
    assert [c.history for c in compare.columns] == [[(FIRST, c.prompt[2]["content"])] for c in record.columns]
    assert len(compare.history.records()) == 3


def test_slot_warning_queue_times_headers_banner_and_tab(
    qtbot, open_window, registry, tiny_base, tiny_adapters
):
    long_name = "an-adapter-with-a-name-far-too-long-for-one-column"
    for name in ("tiny-r4-qv", "tiny-r8-all", "tiny-r16-mlp", "tiny-r32-ko-down"):
        registry.import_folder(tiny_adapters[name], tiny_base, max_rank=32)
    registry.import_folder(tiny_adapters["tiny-r8-attn"], tiny_base, name=long_name, max_rank=32)
    window = open_window()
    window.show_page("Compare")
    compare = window.compare
    compare.tick_all(True)
    assert compare.slot_warning.isVisible()
    assert "5 adapters ticked" in compare.slot_warning.text() and "4 GPU slots" in compare.slot_warning.text()
    compare.set_checked(["base", "tiny-r4-qv"])
    assert not compare.slot_warning.isVisible()
    compare.tick_all(True)
    compare.max_tokens.setValue(12)
    compare.ignore_eos.setChecked(True)
    compare.prompt.setPlainText(FIRST)
    with qtbot.waitSignal(compare.runFinished, timeout=RUN_MS):
        assert compare.start()
    assert len(compare.columns) == 6
    for column in compare.columns:
        assert column.queue_s is not None and "queued" in column.stats.text() and " s" in column.stats.text()
        assert " ms" not in column.stats.text()
    queue = [c.queue_s for c in compare.columns]
    ttft = [c.ttft_s for c in compare.columns]
    assert max(queue) > min(ttft)  # the adapter beyond the slots waited for a whole answer of another
    long_column = next(c for c in compare.columns if c.name == long_name)
    assert long_column.title.toolTip() == long_name and "…" in long_column.title.text()

    toolbar_y = compare.run_button.mapTo(window, compare.run_button.rect().topLeft()).y()
    compare.banner.show_message("A long message " * 20)
    qtbot.wait(50)
    assert compare.run_button.mapTo(window, compare.run_button.rect().topLeft()).y() == toolbar_y
    compare.banner.clear()

    window.activateWindow()
    compare.prompt.setFocus()
    qtbot.waitUntil(compare.prompt.hasFocus, timeout=5000)
    qtbot.keyClick(compare.prompt, Qt.Key.Key_Tab)
    assert not compare.prompt.hasFocus() and "\t" not in compare.prompt.toPlainText()


def test_column_settings_refuse_bad_stop_strings_and_go_back_to_shared(qtbot):
    dialog = ColumnSettingsDialog("tiny-r4-qv", ColumnOverrides(max_tokens=3, stop=("\n",)))
    qtbot.addWidget(dialog)
    assert (
        dialog.max_tokens.value() == 3
        and dialog.stop.text() == "\\n"
        and dialog.temperature.text() == "shared"
    )
    changes = []
    dialog.changed.connect(lambda name, overrides: changes.append((name, overrides)))
    dialog.open()
    dialog.stop.setText("a\\q")
    dialog.accept()
    assert changes == [] and dialog.isVisible() and "unknown escape" in dialog.error.text()
    dialog.reset_button.click()
    assert changes == [("tiny-r4-qv", ColumnOverrides())] and not dialog.isVisible()


def test_a_strength_sweep_runs_one_adapter_at_several_strengths_in_one_batch(qtbot, compare_window):
    compare = compare_window.compare
    engine = compare_window.host.engine
    compare.ignore_eos.setChecked(True)
    compare.sweep_strength("tiny-r8-all")
    columns = ["base", "tiny-r8-all", "tiny-r8-all x0.25", "tiny-r8-all x0.5"]
    assert compare.checked_names() == columns  # the strength columns are listed after their adapter
    send(qtbot, compare, FIRST, compare.start)
    assert [c.name for c in compare.columns] == columns
    prompt = compare.columns[0].output.prompt_token_ids
    params = [
        SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, adapter_scale=s) for s in (0.25, 0.5, 1)
    ]
    expected = engine.generate(
        [prompt] * 4, [None, *["tiny-r8-all"] * 3], [params[2], params[2], *params[:2]]
    )
    assert [c.output.token_ids for c in compare.columns] == [e.token_ids for e in expected]
    assert expected[2].token_ids != expected[1].token_ids or expected[3].token_ids != expected[1].token_ids
    record = compare.history.records()[0]
    assert [(c.adapter, c.adapter_scale) for c in record.columns] == [
        (None, 1.0),
        ("tiny-r8-all", 1.0),
        ("tiny-r8-all", 0.25),
        ("tiny-r8-all", 0.5),
    ]
    assert record.columns[1].adapter_digest == record.columns[3].adapter_digest is not None

    with qtbot.waitSignal(compare.divergenceFinished, timeout=RUN_MS):  # scored at each column's strength
        compare.view_mode.setCurrentIndex(compare.view_mode.findData(TOKENS))
    column = compare.columns[3]  # x0.5
    ids = [*column.output.prompt_token_ids, *column.output.token_ids]
    half = engine.score([ids], ["tiny-r8-all"], 5, adapter_scales=[0.5])[0].prompt_logprobs
    start = len(column.output.prompt_token_ids)
    assert column.divergence[0].logprob == pytest.approx(half[start].logprob, abs=1e-4)

    compare.new_chat()
    compare.set_checked(["base"])
    with qtbot.waitSignal(compare.runFinished, timeout=RUN_MS):
        assert compare.rerun(record)
    assert compare.checked_names() == columns
    assert [c.output.token_ids for c in compare.columns] == [e.token_ids for e in expected]
    save_screenshot(compare_window, "compare-strength-sweep")
