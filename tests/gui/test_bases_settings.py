"""Each base model's own engine settings in Settings (GPU slots, largest rank, CPU RAM tier, KV
cache): edited per base in the models list, saved with it, used when that base's engine starts,
refused in the banner when the engine would refuse them."""

from __future__ import annotations

from tests.gui.conftest import save_screenshot, wait_ready


def test_each_base_starts_with_its_own_engine_settings(qtbot, open_window, two_bases, qwen_base):
    folder, _ = qwen_base
    window = open_window()
    settings = window.settings
    window.show_page("Settings")
    assert not settings.own_box.isEnabled()  # no base of the list selected
    settings.extra_models.setCurrentRow(0)
    assert settings.own_box.isEnabled() and settings.own_max_loras.text() == "as Engine"
    settings.own_max_loras.setValue(2)
    settings.own_max_lora_rank.setValue(16)
    settings.own_kv_cache_memory_gb.setValue(0.5)
    entry = f"{folder},max-loras=2,max-lora-rank=16,kv-cache-gb=0.5"
    assert settings.extra_model_entries() == [entry]
    settings.max_loras.setValue(3)  # the Engine's: the first base's, and the default of the others
    assert settings.apply(), settings.banner.text
    wait_ready(qtbot, window)

    pool = window.host.pool
    llama, qwen = pool.names
    own, shared = pool.base(qwen).config, pool.base(llama).config
    assert (shared.max_loras, shared.max_lora_rank, shared.kv_cache_memory_gb) == (3, 32, None)
    assert (own.max_loras, own.max_lora_rank, own.kv_cache_memory_gb) == (2, 16, 0.5)
    assert dict(pool.resident())[qwen].config.max_loras == 2  # the running engine's
    assert window.prefs.engine_choice().extra_models == (entry,)
    monitor = window.monitor
    window.show_page("Monitor")
    qtbot.waitUntil(lambda: [len(panel.slots.cells) for panel in monitor.panels] == [3, 2], timeout=10_000)

    window.show_page("Settings")
    settings.extra_models.setCurrentRow(-1)
    assert not settings.own_box.isEnabled()
    settings.extra_models.setCurrentRow(0)  # the entry's values shown again
    assert (settings.own_max_loras.value(), settings.own_max_lora_rank.value()) == (2, 16)
    assert settings.own_max_cpu_loras.value() == 0 and settings.own_kv_cache_memory_gb.value() == 0.5
    save_screenshot(window, "settings-own-base-settings")

    settings.own_max_cpu_loras.setValue(1)  # fewer than its 2 slots: the engine would refuse it
    assert not settings.apply()
    assert "'Adapters kept in CPU RAM'" in settings.banner.text, settings.banner.text
    settings.own_max_cpu_loras.setValue(0)  # back to the Engine's (automatic)
    settings.own_max_loras.setValue(0)
    assert settings.extra_model_entries() == [f"{folder},max-lora-rank=16,kv-cache-gb=0.5"]
    assert window.host.pool is pool  # nothing refused was applied
