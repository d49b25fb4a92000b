"""Several base models in the window (Settings' models list, a BasePool): Compare columns from two
bases equal each base's own engine, token for token, colocated and swapped; the Library filters by
base; the Monitor shows each base's state, slots and tiers; the endpoint serves both bases."""

from __future__ import annotations

from dataclasses import replace

import pytest
from PySide6.QtCore import Qt

from multilora_studio.cli.shared import describe_base
from multilora_studio.engine import Engine, SamplingParams
from multilora_studio.gui.base_panel import BasePanel
from multilora_studio.gui.base_states import LOADED, LOADING, PARKED, SWAPPED_OUT, BaseState
from multilora_studio.gui.preferences import EngineChoice
from tests.gui.conftest import LLAMA_ADAPTERS, save_screenshot, wait_ready
from tests.gui.test_server import start_endpoint

PROMPT = "Tell me about lighthouses."
TOKENS = 12


def run_compare(qtbot, compare, names: list[str]) -> dict[str, list[int]]:
    compare.pick_base(None)
    compare.prompt.setPlainText(PROMPT)
    compare.set_checked(names)
    compare.max_tokens.setValue(TOKENS)
    compare.temperature.setValue(0.0)
    compare.ignore_eos.setChecked(True)
    with qtbot.waitSignal(compare.runFinished, timeout=180_000):
        assert compare.start(), compare.banner.text
    assert not [c.error for c in compare.columns if c.error]
    return {c.name: list(c.output.token_ids) for c in compare.columns}


def own_engine_tokens(
    choice: EngineChoice, model: str, adapters: dict[str, str]
) -> dict[str | None, list[int]]:
    """Greedy tokens of a fresh engine of ``model`` alone, for its base and each adapter."""
    engine = Engine(choice.engine_config(model))
    try:
        for name, path in adapters.items():
            engine.add_adapter(name, path)
        chat = [{"role": "user", "content": PROMPT}]
        params = SamplingParams(max_tokens=TOKENS, temperature=0.0, ignore_eos=True)
        names: list[str | None] = [None, *adapters]
        outputs = engine.generate([chat] * len(names), names, params)
        return {name: list(output.token_ids) for name, output in zip(names, outputs, strict=True)}
    finally:
        engine.shutdown()


@pytest.fixture
def expected(two_bases, tiny_model_dir, tiny_adapters, qwen_base):
    """Each base's own engine's tokens, by column name."""
    llama = own_engine_tokens(
        two_bases, str(tiny_model_dir), {"tiny-r8-all": str(tiny_adapters["tiny-r8-all"])}
    )
    qwen = own_engine_tokens(two_bases, str(qwen_base[0]), {"qwen-r8": str(qwen_base[1])})
    assert llama[None] != qwen[None]  # the bases answer differently: a column on the wrong base shows
    return {
        "base": llama[None],
        "tiny-r8-all": llama["tiny-r8-all"],
        qwen_base[0].name: qwen[None],  # the second base's column is called by its name
        "qwen-r8": qwen["qwen-r8"],
    }


def test_columns_of_two_bases_equal_each_bases_own_engine(qtbot, open_window, two_bases, expected, qwen_base):
    window = open_window()
    pool = window.host.pool
    llama, qwen = pool.names
    assert llama == "tiny-llama0" and qwen == qwen_base[0].name
    compare = window.compare
    window.show_page("Compare")
    listed = [
        compare.adapters.item(i).data(Qt.ItemDataRole.UserRole) for i in range(compare.adapters.count())
    ]
    assert listed == ["base", *sorted(LLAMA_ADAPTERS), qwen, "qwen-r8"]
    assert compare.base_picker.isVisible() and compare.base_picker.count() == 3
    compare.pick_base(qwen)
    listed = [
        compare.adapters.item(i).data(Qt.ItemDataRole.UserRole) for i in range(compare.adapters.count())
    ]
    assert listed == [qwen, "qwen-r8"]

    got = run_compare(qtbot, compare, ["base", "tiny-r8-all", qwen, "qwen-r8"])
    assert got == expected
    assert compare.column_bases == [llama, llama, qwen, qwen]
    assert [c.base for c in compare.columns] == [llama, llama, qwen, qwen]
    assert compare.columns[3].title.toolTip() == f"qwen-r8 on base model {qwen}"
    assert compare.columns[2].title.toolTip() == f"{qwen} (the model without an adapter) on base model {qwen}"
    assert [c.reference for c in compare.columns] == [True, False, True, False]
    assert "one batched run on each of 2 bases" in compare.summary.text()
    record = compare.comparison.record
    assert [c.base.model_name for c in record.columns] == [llama, llama, qwen, qwen]
    assert record.columns[3].base.model_digest == pool.base(qwen).digest
    save_screenshot(window, "compare-two-bases")

    # a rerun sends each column to the base it ran on
    with qtbot.waitSignal(compare.runFinished, timeout=180_000):
        assert compare.rerun(record)
    assert {c.name: list(c.output.token_ids) for c in compare.columns} == got
    assert compare.banner.text == ""


def test_with_room_for_one_base_columns_swap_it_and_stay_equal(
    qtbot, open_window, two_bases, expected, make_prefs
):
    make_prefs().set_engine_choice(replace(two_bases, max_resident_bases=1))
    window = open_window()
    pool = window.host.pool
    llama, qwen = pool.names
    assert [name for name, _ in pool.resident()] == [llama]  # the first base started, the other not
    window.show_page("Monitor")
    monitor = window.monitor
    qtbot.waitUntil(lambda: [p.state for p in monitor.bases] == [LOADED, SWAPPED_OUT], timeout=5000)
    assert monitor.bases[1].title().startswith(f"{qwen}: swapped out")
    assert "the base loads on its next request" in monitor.bases[1].note.text()
    assert window.library.row_of("qwen-r8")["Tier"] == "disk (base swapped out)"

    window.show_page("Compare")
    assert run_compare(qtbot, window.compare, ["base", "tiny-r8-all", qwen, "qwen-r8"]) == expected
    # llama's columns ran first, then qwen was loaded in its place once they had ended
    assert [name for name, _ in pool.resident()] == [qwen]
    assert pool.base(qwen).loads == 1 and pool.base(llama).loads == 1
    window.show_page("Monitor")
    # the swap parked llama's engine in host memory: the adapter its column used is in its CPU RAM
    qtbot.waitUntil(lambda: [p.state for p in monitor.bases] == [PARKED, LOADED], timeout=5000)
    assert monitor.bases[0].title().startswith(f"{llama}: parked in host memory")
    assert "(1 in CPU RAM)" in monitor.bases[0].note.text()
    assert window.library.row_of("tiny-r8-all")["Tier"] == "CPU (base parked)"

    # the Library's actions on an adapter of a swapped-out base lease (load) its base
    window.show_page("Library")
    with qtbot.waitSignal(window.host.adaptersChanged, timeout=120_000):
        window.library.set_pinned("tiny-r8-all", True)
    assert window.library.banner.kind == "success", window.library.banner.text
    assert [name for name, _ in pool.resident()] == [llama]
    assert window.library.registry.get("tiny-r8-all").pinned


def test_the_monitor_shows_every_base_and_the_library_filters_by_base(
    qtbot, open_window, two_bases, qwen_base, tiny_base
):
    window = open_window()
    llama, qwen = window.host.pool.names
    run_compare(qtbot, window.compare, ["tiny-r8-all", "qwen-r8", "tiny-r4-qv"])

    window.show_page("Monitor")
    monitor = window.monitor
    qtbot.waitUntil(lambda: len(monitor.bases) == 2 and len(monitor.panels) == 2, timeout=5000)
    assert [p.state for p in monitor.bases] == [LOADED, LOADED]
    titles = [p.title() for p in monitor.bases]
    assert titles[0].startswith(f"{llama}: loaded on ") and titles[1].startswith(f"{qwen}: loaded on ")
    assert all("slots held" in t and "KV " in t and "in CPU RAM" in t for t in titles)

    def held(panel) -> set[str]:
        return {c.adapter.text() for c in panel.slots.cells if c.adapter.text() != "empty"} | set(
            panel.cpu_names()
        )

    qtbot.waitUntil(lambda: held(monitor.panels[1]) == {"qwen-r8"}, timeout=10_000)
    assert held(monitor.panels[0]) == set(LLAMA_ADAPTERS)  # each base holds only its own adapters
    assert "3 adapters served" in monitor.counts.text()
    assert monitor.stats_box.title() == "Engines: the sum over 2 loaded bases"
    save_screenshot(window, "monitor-two-bases")

    library = window.library
    window.show_page("Library")
    entries = [library.base_filter.itemText(i) for i in range(library.base_filter.count())]
    assert entries[0] == "All bases" and len(entries) == 3
    assert all(", served" in entry for entry in entries[1:])
    assert sorted(library.names()) == sorted([*LLAMA_ADAPTERS, "qwen-r8"])
    assert library.filter_base(qwen) and library.names() == ["qwen-r8"]
    assert library.row_of("qwen-r8")["Tier"].startswith(("GPU slot", "CPU"))
    save_screenshot(window, "library-by-base")
    library.filter.setText("r8")  # the text filter and the base filter together
    assert library.names() == ["qwen-r8"]
    assert library.filter_base(llama) and library.names() == ["tiny-r8-all"]
    library.filter.clear()
    assert sorted(library.names()) == sorted(LLAMA_ADAPTERS)
    assert library.filter_base(None) and len(library.names()) == 3
    assert not library.filter_base("no-such-base")


def test_a_loading_base_shows_its_progress(qtbot):
    panel = BasePanel()
    qtbot.addWidget(panel)
    loading = BaseState("big", "", LOADING, None, (), ("a", "b"), (0.4, "reading weights"), 1, None)
    panel.show_base(loading, 2)
    assert panel.title() == "big: loading" and panel.progress.value() == 400
    assert panel.note.text() == "reading weights (2 adapters wait for it)" and not panel.replicas
    failed = replace(loading, state=SWAPPED_OUT, progress=None, error="out of memory")
    panel.show_base(failed, 2)
    assert panel.progress.isHidden() and "Its last load failed: out of memory" in panel.note.text()


def test_settings_add_a_base_and_the_endpoint_serves_both(qtbot, open_window, registry, qwen_base, tiny_base):
    folder, adapter = qwen_base
    registry.import_folder(adapter, describe_base(str(folder)), name="qwen-r8", max_rank=32)
    window = open_window()
    settings = window.settings
    assert EngineChoice().max_resident_bases == 0 and EngineChoice().keep_alive_s == 0  # serve's defaults
    assert settings.max_resident_bases.text() == "all" and settings.keep_alive.text() == "never"
    assert window.host.pool.names == ["tiny-llama0"]
    assert window.library.row_of("qwen-r8")["Tier"] == "not served"  # no base of its weights

    window.show_page("Settings")
    settings.add_extra_model(str(folder / "missing"))
    assert not settings.apply() and "does not exist" in settings.banner.text
    settings.extra_models.clear()
    settings.add_extra_model(str(folder))
    settings.keep_alive.setValue(3600)
    assert settings.apply()
    wait_ready(qtbot, window)
    assert window.host.pool.names == ["tiny-llama0", folder.name]
    saved = window.prefs.engine_choice()
    assert saved.extra_models == (str(folder),) and saved.keep_alive_s == 3600
    assert window.host.pool.keep_alive_s == 3600
    save_screenshot(window, "settings-bases")

    window.show_page("Server")
    client = start_endpoint(qtbot, window)
    models = {m.id: m for m in client.models.list().data}
    assert {"tiny-llama0", folder.name, "qwen-r8"} <= set(models)
    assert getattr(models["qwen-r8"], "parent", None) == folder.name
    for model in ("qwen-r8", "tiny-llama0", folder.name):
        reply = client.completions.create(model=model, prompt="Hi", max_tokens=3, temperature=0)
        assert reply.usage.completion_tokens == 3
