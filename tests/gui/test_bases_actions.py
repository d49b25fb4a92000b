"""Evaluate and *Merge and export…* on the base a person picks when the window serves two (a tiny
Llama and a tiny Qwen2): each runs on that base only, equal to that base's own engine, and a
swapped-out base is loaded for an evaluation (with its load's progress) but not for a merge."""

from __future__ import annotations

import json
import threading
from dataclasses import replace

import pytest
from PySide6.QtCore import Qt

from multilora_studio.adapters.registry import MERGED_REVISION
from multilora_studio.deploy import BaseUnavailable
from multilora_studio.engine import Engine, EngineConfig, SamplingParams
from multilora_studio.evaluate import BASE, EvalSettings, load_prompt_set, run_eval
from tests.gui.conftest import LLAMA_ADAPTERS, save_screenshot, wait_ready, wait_task

ROWS = [
    {"prompt": "Once upon a time", "reference": " there", "check": "contains"},
    {"prompt": "The sky is", "reference": " blue", "check": {"type": "choice", "choices": [" blue", " red"]}},
]
TOKENS = 6


@pytest.fixture
def one_resident(two_bases, make_prefs):
    """Settings that serve both bases with room for one loaded at a time."""
    choice = replace(two_bases, max_resident_bases=1)
    make_prefs().set_engine_choice(choice)
    return choice


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return path


def listed(view) -> list[str]:
    return [view.adapters.item(i).data(Qt.ItemDataRole.UserRole) for i in range(view.adapters.count())]


def resident(window) -> list[str]:
    return [name for name, _ in window.host.pool.resident()]


def own_results(choice, folder, adapters, prompt_file):
    """The evaluation on a fresh engine of base ``folder`` alone, with ``adapters`` (name -> folder)."""
    with Engine(choice.engine_config(str(folder))) as engine:
        for name, path in adapters.items():
            engine.add_adapter(name, path)
        return run_eval(
            engine, load_prompt_set(prompt_file, None), [BASE, *adapters], EvalSettings(max_tokens=TOKENS)
        )


def test_a_lease_of_a_swapped_out_base_reports_its_load(qtbot, open_window, one_resident, qwen_base):
    window = open_window()
    llama, qwen = window.host.pool.names
    assert resident(window) == [llama]
    heard: list[str] = []
    done = threading.Event()

    def lease() -> None:
        with window.host.lease(qwen, lambda fraction, message: heard.append(message)) as engine:
            assert engine.model_name == qwen
        done.set()

    threading.Thread(target=lease, daemon=True).start()
    qtbot.waitUntil(done.is_set, timeout=120_000)
    assert heard[0] == f"waiting for base model {qwen} to load (it is swapped out)"
    assert any(message.startswith(f"loading base model {qwen}: ") for message in heard[1:]), heard
    assert resident(window) == [qwen]
    heard.clear()
    with window.host.lease(qwen, lambda fraction, message: heard.append(message)):
        pass
    assert heard == []  # a loaded base: nothing to wait for


def test_a_restart_ends_a_lease_waiting_for_its_base_with_a_message(qtbot, open_window, one_resident):
    window = open_window()
    pool = window.host.pool
    llama, qwen = pool.names
    outcome: list[str] = []

    def wait_for_qwen() -> None:
        try:
            with window.host.lease(qwen):
                outcome.append("leased")
        except BaseUnavailable as error:
            outcome.append(str(error))

    with window.host.lease(llama):  # llama busy: qwen waits for room
        threading.Thread(target=wait_for_qwen, daemon=True).start()
        qtbot.waitUntil(lambda: pool.waiting(qwen) == 1, timeout=10_000)
        window.host.start(window.host.choice)
        qtbot.waitUntil(lambda: outcome != [], timeout=60_000)
    assert outcome == [f"the engines restarted while this waited for base model {qwen}; try again"]
    wait_ready(qtbot, window)


def test_evaluate_runs_on_the_picked_base_and_a_rerun_on_the_base_it_ran_on(
    qtbot, open_window, one_resident, qwen_base, prompt_file, tmp_path
):
    folder, adapter = qwen_base
    expected = own_results(one_resident, folder, {"qwen-r8": adapter}, prompt_file)
    window = open_window()
    pool = window.host.pool
    llama, qwen = pool.names
    window.show_page("Evaluate")
    view = window.evaluate
    view.results_dir = tmp_path / "runs"
    assert view.base_picker.isVisible() and view.picked_base() == llama
    assert listed(view) == [BASE, *sorted(LLAMA_ADAPTERS)]
    assert view.pick_base(qwen) and listed(view) == [BASE, "qwen-r8"]
    assert not view.pick_base("no-such-base")

    view.path.setText(str(prompt_file))
    view.max_tokens.setValue(TOKENS)
    view.set_checked([BASE, "qwen-r8"])
    with qtbot.waitSignal(view.runFinished, timeout=180_000):
        assert view.start(), view.banner.text
        assert f"(base model {qwen})" in view.summary.text()
    assert view.banner.text == "", view.banner.text
    results = view.results
    assert results.model == qwen and results.base_digest == pool.base(qwen).digest
    assert results.cells == expected.cells  # qwen's answers, not llama's
    assert resident(window) == [qwen]  # loaded for the run in llama's place
    qwen_run = view.saved
    save_screenshot(window, "evaluate-second-base")

    # an evaluation of the first base swaps it back; the rerun of qwen's goes to qwen
    view.pick_base(llama)
    view.set_checked([BASE, LLAMA_ADAPTERS[0]])
    with qtbot.waitSignal(view.runFinished, timeout=180_000):
        assert view.start()
    assert view.results.model == llama and resident(window) == [llama]
    with qtbot.waitSignal(view.runFinished, timeout=180_000):
        assert view.rerun(qwen_run)
    assert view.banner.text == "", view.banner.text
    assert view.picked_base() == qwen and view.checked_names() == sorted([BASE, "qwen-r8"])
    assert view.results.cells == expected.cells and resident(window) == [qwen]
    assert pool.base(qwen).loads == 2

    # the base picker is remembered
    window.save_state()
    window.close()
    again = open_window()
    assert again.evaluate.picked_base() == qwen


def test_merge_goes_into_the_adapters_own_base_without_loading_it(
    qtbot, open_window, one_resident, qwen_base, registry, tmp_path
):
    folder, adapter = qwen_base
    window = open_window()
    pool = window.host.pool
    llama, qwen = pool.names
    library = window.library
    window.show_page("Library")
    qtbot.waitUntil(lambda: "qwen-r8" in library.names(), timeout=10_000)
    assert library.select("qwen-r8")
    dialog = library.open_merge_dialog()
    assert dialog.target.currentData() == qwen and not dialog.target.isHidden()
    assert [dialog.adapters.item(row, 0).text() for row in range(dialog.adapters.rowCount())] == ["qwen-r8"]
    assert dialog.checked() == [("qwen-r8", 1.0)]
    dialog.pick_base(llama)
    assert sorted(dialog.adapters.item(r, 0).text() for r in range(dialog.adapters.rowCount())) == sorted(
        LLAMA_ADAPTERS
    )
    assert dialog.checked() == []
    dialog.pick_base(qwen)
    dialog.set_checked({"qwen-r8": 1.0})
    out = tmp_path / "qwen-merged"
    dialog.out.setText(str(out))
    dialog.dtype.setCurrentText("fp32")
    wait_task(qtbot, dialog.start_merge(), 180_000)
    assert dialog.banner.kind == "success", dialog.banner.text
    assert resident(window) == [llama]  # merged from qwen's files: qwen was not loaded
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen2"
    (record,) = [b for b in registry.list_base_models() if b.revision == MERGED_REVISION]
    assert record.path == out

    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    config = EngineConfig(model=str(folder), device="cpu", dtype="float32", max_model_len=64)
    with Engine(config) as engine:
        engine.add_adapter("qwen-r8", adapter)
        served = engine.generate(["Hello there"], ["qwen-r8"], greedy)[0]
    with Engine(replace(config, model=str(out))) as merged_engine:
        merged = merged_engine.generate(["Hello there"], [None], greedy)[0]
    assert merged.token_ids == served.token_ids
