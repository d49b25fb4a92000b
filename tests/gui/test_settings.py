"""Settings: applying restarts the engine with progress; settings, geometry and last choices persist."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import torch
from PySide6.QtCore import QRect
from PySide6.QtGui import QPalette
from safetensors.torch import save_file

from multilora_studio.engine.config import usable_cores
from tests.gui.conftest import save_screenshot, wait_ready


def test_apply_restarts_the_engine_and_everything_persists(qtbot, open_window, make_prefs):
    window = open_window()
    settings = window.settings
    window.show_page("Settings")
    first_engine = window.host.engine
    assert settings.folder.isChecked() and settings.max_loras.value() == 4
    assert (
        settings.batch_invariant.isChecked() and first_engine.config.batch_invariant
    )  # the window's default
    settings.max_loras.setValue(3)
    settings.max_cpu_loras.setValue(5)
    assert settings.cpu_threads.value() == 0 and first_engine.cpu_threads == max(1, usable_cores() - 1)
    settings.cpu_threads.setValue(1)
    settings.batch_invariant.setChecked(False)
    assert settings.enable_prefix_caching.isChecked() and first_engine.config.enable_prefix_caching
    settings.enable_prefix_caching.setChecked(False)
    messages: list[str] = []
    window.host.progress.connect(lambda fraction, message: messages.append(message))
    assert settings.apply()
    assert window.host.state == "loading" and not settings.apply_button.isEnabled()
    wait_ready(qtbot, window)
    engine = window.host.engine
    assert engine is not first_engine and first_engine._stopping
    assert engine.config.max_loras == 3 and engine.config.max_cpu_loras == 5
    assert engine.config.cpu_threads == 1 and engine.cpu_threads == 1
    assert not engine.config.batch_invariant and not engine.runner.model.plan.batch_invariant
    assert len(engine.metrics(fresh=True).slots) == 3
    assert not engine.config.enable_prefix_caching and engine.metrics(fresh=True).prefix_cache_blocks is None
    qtbot.waitUntil(lambda: "prefix cache: off" in window.monitor.stats.text(), timeout=5000)
    assert any("stopping" in m for m in messages) and any("loading" in m for m in messages)
    assert settings.progress.value() == 1000 and "ready" in settings.status.text().lower()
    save_screenshot(window, "settings")
    settings.theme.setCurrentText("Dark")
    qtbot.waitUntil(lambda: window.palette().color(QPalette.ColorRole.Window).lightness() < 60, timeout=2000)
    window.show_page("Compare")
    save_screenshot(window, "compare-dark")

    window.compare.prompt.setPlainText("Remember this prompt")
    window.compare.set_checked(["base"])
    window.compare.max_tokens.setValue(77)
    window.server.port.setValue(8123)
    window.setGeometry(QRect(0, 0, 900, 640))  # the offscreen screen is 800x800: the height fits
    window.show_page("Monitor")
    window.close()

    again = open_window()
    assert again.settings.max_loras.value() == 3 and again.settings.max_cpu_loras.value() == 5
    assert again.settings.cpu_threads.value() == 1 and again.host.engine.cpu_threads == 1
    assert again.host.engine.config.max_loras == 3
    assert not again.settings.batch_invariant.isChecked() and not again.host.engine.config.batch_invariant
    assert not again.settings.enable_prefix_caching.isChecked()
    assert not again.host.engine.config.enable_prefix_caching
    assert again.compare.prompt.toPlainText() == "Remember this prompt"
    assert again.compare.checked_names() == ["base"] and again.compare.max_tokens.value() == 77
    assert again.server.port.value() == 8123
    assert again.page == "Monitor"
    assert again.height() == 640
    assert again.settings.theme.currentText() == "Dark"
    qtbot.waitUntil(lambda: again.palette().color(QPalette.ColorRole.Window).lightness() < 60, timeout=2000)
    again.settings.theme.setCurrentText("Follow the system")  # offscreen reports no scheme: light
    qtbot.waitUntil(lambda: again.palette().color(QPalette.ColorRole.Window).lightness() > 200, timeout=2000)


def engine_workers() -> set[threading.Thread]:
    return {thread for thread in threading.enumerate() if thread.name == "engine-worker"}


def test_bad_settings_show_a_message_and_a_failed_start_can_be_fixed(qtbot, open_window, tmp_path: Path):
    workers_of_others = engine_workers()  # session engines of other suites run in this process too
    window = open_window()
    settings = window.settings
    settings.folder.setChecked(True)
    settings.model.setText(str(tmp_path / "missing"))
    assert not settings.apply()
    assert "does not exist" in settings.banner.text
    assert window.host.state == "ready"  # nothing restarted
    settings.hub.setChecked(True)
    settings.model.clear()
    assert not settings.apply()
    assert "Hub repository id" in settings.banner.text
    settings.device.setCurrentText("gpu0")
    settings.embedded.setChecked(True)
    assert not settings.apply()
    assert "'Device' must be" in settings.banner.text
    settings.device.setCurrentText("cpu")
    settings.max_loras.setValue(8)
    settings.max_cpu_loras.setValue(1)
    assert not settings.apply()
    assert "'Adapters kept in CPU RAM' (1) must be >= 'GPU adapter slots' (8)" in settings.banner.text

    good = settings.prefs.engine_choice()
    running = window.host.engine
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    settings.show_choice(good)
    settings.model.setText(str(empty))
    assert settings.apply()
    qtbot.waitUntil(lambda: "Not applied" in settings.banner.text, timeout=60_000)
    assert "config.json" in settings.banner.text and "Traceback" not in settings.banner.text
    assert window.host.state == "ready" and window.host.engine is running  # checked before stopping it
    assert settings.prefs.engine_choice() == good  # a refused setting is not saved
    assert running.generate(["Hi"], [None], None)[0].token_ids

    broken = tmp_path / "broken-model"  # passes the check (config, a safetensors header), fails to load
    broken.mkdir()
    for item in Path(good.model).iterdir():  # config and tokenizer files; weights of another model
        if item.is_file() and item.suffix != ".safetensors":
            shutil.copy(item, broken / item.name)
    save_file({"unrelated": torch.zeros(2)}, str(broken / "model.safetensors"))
    settings.model.setText(str(broken))
    states: list[str] = []
    window.host.stateChanged.connect(states.append)
    assert settings.apply()
    qtbot.waitUntil(lambda: "did not start" in settings.banner.text, timeout=60_000)
    assert "lacks tensor" in settings.banner.text and "last settings that worked" in settings.banner.text
    wait_ready(qtbot, window)  # the previous settings started again
    assert "failed" in states and window.host.engine is not running and running._stopping
    assert Path(window.host.engine.base.folder) == Path(good.model)
    assert settings.prefs.engine_choice() == good
    assert window.host.engine.generate(["Hi"], [None], None)[0].token_ids

    settings.show_choice(good)
    settings.max_loras.setValue(2)

    def cancel_when_loading(fraction: float, message: str) -> None:  # after the running engine stopped
        if message.startswith("loading"):
            window.host.cancel_start()

    window.host.progress.connect(cancel_when_loading)
    assert settings.apply()
    qtbot.waitUntil(lambda: window.host.state == "stopped", timeout=60_000)
    window.host.progress.disconnect(cancel_when_loading)
    assert "cancelled" in settings.status.text() and window.host.engine is None
    # the cancelled start's worker ends: only the engines other fixtures hold keep theirs
    qtbot.waitUntil(lambda: engine_workers() <= workers_of_others, timeout=60_000)
    assert settings.apply()
    wait_ready(qtbot, window)
    assert window.host.engine.generate(["Hi"], [None], None)[0].token_ids
