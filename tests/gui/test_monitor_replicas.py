"""Several engine replicas in the window: Settings' devices list starts a replica set, Compare's
columns equal one engine's, and the Monitor shows each replica's slots and CPU tier with each
adapter on one replica."""

from __future__ import annotations

import weakref
from dataclasses import replace

from multilora_studio.deploy import ReplicaSet
from tests.gui.conftest import save_screenshot, wait_ready
from tests.live_objects import live_engines

ADAPTERS = ("tiny-r4-qv", "tiny-r8-all", "tiny-r16-mlp", "tiny-r8-attn")


def run_compare(qtbot, window) -> dict[str, list[int]]:
    compare = window.compare
    compare.set_checked(["base", *ADAPTERS])
    compare.max_tokens.setValue(12)
    compare.ignore_eos.setChecked(True)
    with qtbot.waitSignal(compare.runFinished, timeout=120_000):
        assert compare.start()
    return {c.name: list(c.output.token_ids) for c in compare.columns if c.output is not None}


def held_by_panel(monitor) -> list[set[str]]:
    """Adapters each replica's panel shows, in its GPU slots or its CPU RAM tier."""
    return [
        {cell.adapter.text() for cell in panel.slots.cells if cell.adapter.text() != "empty"}
        | set(panel.cpu_names())
        for panel in monitor.panels
    ]


def test_replicas_from_settings_answer_like_one_engine_and_show_in_the_monitor(
    qtbot, open_window, make_prefs, tiny_choice, registry, tiny_base, tiny_adapters, engine_device
):
    for name in ADAPTERS:
        registry.import_folder(tiny_adapters[name], tiny_base, max_rank=32)
    make_prefs().set_engine_choice(replace(tiny_choice, max_loras=2))
    window = open_window()
    one_engine = run_compare(qtbot, window)
    assert len(window.monitor.panels) == 1 and len(one_engine) == 5

    settings = window.settings
    window.show_page("Settings")
    settings.devices.setText("cuda:7")
    assert not settings.apply()
    assert "'Engine replicas on' must exist: cuda:7 does not" in settings.banner.text
    settings.devices.setText(f"{engine_device},{engine_device}")
    settings.dispatch_margin.setValue(4)
    assert settings.apply()
    wait_ready(qtbot, window)
    engine = window.host.engine
    assert isinstance(engine, ReplicaSet) and len(engine.replicas) == 2 and engine.margin == 4
    assert [replica.config.max_loras for replica in engine.replicas] == [2, 2]
    assert make_prefs().engine_choice().devices == f"{engine_device},{engine_device}"

    assert run_compare(qtbot, window) == one_engine  # batch-invariant: the same tokens on either replica
    assert sum(engine.dispatched) >= len(one_engine) and min(engine.dispatched) >= 1

    monitor = window.monitor
    window.show_page("Monitor")
    qtbot.waitUntil(lambda: len(monitor.panels) == 2, timeout=5000)
    qtbot.waitUntil(lambda: set().union(*held_by_panel(monitor)) == set(ADAPTERS), timeout=10_000)
    titles = [panel.title() for panel in monitor.panels]
    assert titles[0].startswith(f"Replica 0 on {engine_device}") and titles[1].startswith("Replica 1")
    held = held_by_panel(monitor)
    assert not held[0] & held[1], held  # each adapter read by one replica only
    assert all(held), held  # both replicas took some
    assert all(len(panel.slots.cells) == 2 for panel in monitor.panels)
    assert f"device: {engine_device},{engine_device}" == window.status.device.text()
    save_screenshot(window, "monitor-replicas")

    replicas = [weakref.ref(replica) for replica in engine.replicas]
    settings.devices.setText("")
    assert settings.apply()
    wait_ready(qtbot, window)
    assert not isinstance(window.host.engine, ReplicaSet)
    qtbot.waitUntil(lambda: len(monitor.panels) == 1, timeout=5000)
    del engine  # the replica set: only the window may still hold it, and it must not
    live_engines()  # collects, frozen objects included
    assert [ref() for ref in replicas] == [None, None]  # the set's engines were freed
