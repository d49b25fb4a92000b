"""The window's first start on the embedded model offers the demo adapters; a restart keeps a removal."""

from __future__ import annotations

from PySide6.QtCore import QSettings

from multilora_studio.adapters.registry import Registry
from multilora_studio.demo import read_index
from multilora_studio.gui.main_window import MainWindow
from multilora_studio.gui.preferences import EngineChoice, Preferences
from tests.gui.conftest import wait_ready, wait_task

DEMO = sorted(entry["name"] for entry in read_index()["adapters"])
LIBRARY_READ_MS = 30_000  # bounds a hang only


def test_first_start_lists_the_demo_adapters_and_a_restart_keeps_a_removal(
    qtbot, qapp, new_user_home, tmp_path, engine_device
):
    prefs = Preferences(QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat))
    choice = EngineChoice(device=engine_device, dtype="float32")  # the embedded model
    prefs.set_engine_choice(choice)
    registry = Registry()  # the new user's library, in new_user_home
    window = MainWindow(prefs, registry)
    try:
        window.show()
        wait_ready(qtbot, window)
        # the Library reads the library on a task thread once the engine is ready
        qtbot.waitUntil(lambda: sorted(window.library.names()) == DEMO, timeout=LIBRARY_READ_MS)
        assert window.library.row_of("demo-shout")["Base"] == "SmolLM2-135M-Instruct"
        compare = window.compare
        listed = [compare.adapters.item(i).text() for i in range(compare.adapters.count())]
        assert listed[1:] == DEMO
        engine = window.host.engine
        assert engine is not None
        assert sorted(info.name for info in engine.list_adapters()) == DEMO

        wait_task(qtbot, window.library.remove("demo-pirate"))
        assert window.library.banner.kind == "success", window.library.banner.text
        window.restart_engine(choice)
        wait_ready(qtbot, window)
        remaining = [name for name in DEMO if name != "demo-pirate"]
        # a removed demo adapter stays removed (polled: the view reads after the restart)
        qtbot.waitUntil(lambda: sorted(window.library.names()) == remaining, timeout=LIBRARY_READ_MS)
        engine = window.host.engine
        assert engine is not None
        assert sorted(info.name for info in engine.list_adapters()) == remaining
    finally:
        window.close()
