"""Monitor view fed by the real engine's metrics: slots, CPU tier, counters, the prefix cache, cold
start by adapter and plots around a run."""

from __future__ import annotations

from dataclasses import replace

from tests.gui.conftest import save_screenshot, wait_task

ADAPTERS = ("tiny-r4-qv", "tiny-r8-all", "tiny-r16-mlp")


def test_monitor_shows_slots_tiers_and_live_plots(
    qtbot, open_window, make_prefs, tiny_choice, registry, tiny_base, tiny_adapters
):
    for name in ADAPTERS:
        registry.import_folder(tiny_adapters[name], tiny_base, max_rank=32)
    make_prefs().set_engine_choice(replace(tiny_choice, max_loras=2))  # fewer slots than adapters
    window = open_window()
    monitor = window.monitor
    window.show_page("Monitor")
    qtbot.waitUntil(lambda: len(monitor.panels[0].slots.cells) == 2, timeout=5000)
    assert [cell.adapter.text() for cell in monitor.panels[0].slots.cells] == ["empty", "empty"]
    wait_task(qtbot, window.library.set_pinned("tiny-r4-qv", True))

    compare = window.compare
    compare.set_checked(["base", *ADAPTERS])
    compare.max_tokens.setValue(160)  # a run of several metrics ticks
    compare.ignore_eos.setChecked(True)
    busy_seen: list[int] = []
    window.metrics_timer.timeout.connect(
        lambda: busy_seen.append(sum(1 for c in monitor.panels[0].slots.cells if c.state == "busy"))
    )
    with qtbot.waitSignal(compare.runFinished, timeout=120_000):
        assert compare.start()
    qtbot.waitUntil(lambda: monitor.last is not None and monitor.last.state == "idle", timeout=5000)

    metrics = monitor.last
    print("BUSY", busy_seen, monitor.series("batch_size"), monitor.series("tokens_per_second"))
    assert max(busy_seen) >= 1  # the grid showed slots in use while the run went on
    held = [cell.adapter.text() for cell in monitor.panels[0].slots.cells]
    assert "tiny-r4-qv" in held and set(held) <= set(ADAPTERS)
    pinned_cell = monitor.panels[0].slots.cells[held.index("tiny-r4-qv")]
    assert "pinned" in pinned_cell.detail.text()
    assert metrics.gpu_misses >= 3  # three adapters through two slots
    cpu = [monitor.panels[0].cpu_list.item(i).text() for i in range(monitor.panels[0].cpu_list.count())]
    assert sorted(cpu) == sorted(ADAPTERS) == sorted(metrics.cpu_adapters)
    assert "3 adapters served: 2 in GPU slots, 1 only in CPU RAM, 0 only on disk" in monitor.counts.text()
    assert max(monitor.series("tokens_per_second")) > 0
    assert max(monitor.series("batch_size")) >= 2
    assert max(monitor.series("distinct_adapters")) >= 2
    xs, ys = monitor.curves["tokens_per_second"].getData()
    assert len(xs) == len(monitor.series("tokens_per_second")) > 3 and max(ys) > 0
    assert "tokens/s" in monitor.stats.text() and "GPU slot hits" in monitor.stats.text()
    assert metrics.upload_p95_s is not None and "slot upload p50" in monitor.stats.text()
    loader = f"loader {metrics.adapter_loader} x{metrics.adapter_load_workers}"
    assert loader in monitor.stats.text() and metrics.adapter_load_workers >= 1
    assert metrics.kernel_compiles == 0 and "kernel compiles" not in monitor.stats.text()
    monitor.update_metrics(replace(metrics, kernel_compiles=2, kernel_compile_s=1.25))
    assert "2 kernel compiles while serving (1.2 s of stalls)" in monitor.stats.text()
    # the prefix cache: every column's prompt looked up, its whole blocks kept (another adapter each:
    # none found), as tokens and against the KV cache
    blocks, block = metrics.prefix_cache_blocks, window.host.engine.config.block_size
    assert blocks is not None and blocks > 0 and metrics.prefix_cache_queried_tokens > 0
    cached = f"{blocks} / {metrics.kv_blocks_total} KV blocks cached ({blocks * block} tokens)"
    assert f"prefix cache: hit rate <b>{metrics.prefix_cache_hit_rate:.0%}</b>" in monitor.stats.text()
    assert cached in monitor.stats.text() and len(monitor.series("prefix_cache_hit_rate")) > 3
    monitor.update_metrics(replace(metrics, prefix_cache_blocks=None, prefix_cache_queried_tokens=0))
    assert "prefix cache: off" in monitor.stats.text() and "KV blocks cached" not in monitor.stats.text()
    monitor.update_metrics(metrics)
    assert window.library.row_of("tiny-r4-qv")["Tier"].startswith("GPU slot")
    # each adapter's own loads: together, the engine's disk reads and slot uploads
    loads = {a.adapter: a for a in metrics.adapter_loads}
    assert sorted(loads) == sorted(ADAPTERS)
    assert sum(a.disk_to_host.loads for a in loads.values()) == metrics.cpu_misses
    assert sum(a.host_to_gpu.loads for a in loads.values()) == metrics.gpu_misses
    assert all(a.host_to_gpu.loads >= 1 and a.host_to_gpu.p95_s is not None for a in loads.values())
    table = monitor.loads.table
    qtbot.waitUntil(lambda: table.rowCount() == len(ADAPTERS), timeout=5000)
    shown = {table.item(r, 1).text(): int(table.item(r, 4).text()) for r in range(table.rowCount())}
    assert shown == {name: a.host_to_gpu.loads for name, a in loads.items()}
    save_screenshot(window, "monitor")
