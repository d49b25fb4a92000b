"""The window's first start on the embedded model offers the demo adapters (a restart keeps a removal)
and Evaluate offers their prompt set."""

from __future__ import annotations

from PySide6.QtCore import QSettings, Qt

from multilora_studio.adapters.registry import Registry
from multilora_studio.demo import demo_prompt_set, read_index
from multilora_studio.evaluate import BASE
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


def test_evaluate_offers_the_demo_prompt_set_while_its_field_is_empty(
    qtbot, qapp, new_user_home, tmp_path, engine_device
):
    prefs = Preferences(QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat))
    choice = EngineChoice(device=engine_device, dtype="float32", batch_invariant=False)  # the embedded model
    prefs.set_engine_choice(choice)
    window = MainWindow(prefs, Registry())
    try:
        window.show()
        window.show_page("Evaluate")
        view = window.evaluate
        button = view.prompt_set.demo_button
        assert view.path.text() == "" and button.isVisible()
        wait_ready(qtbot, window)
        qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
        assert view.path.text() == str(demo_prompt_set()) and not button.isVisible()
        qtbot.waitUntil(lambda: view.checked_names() == [BASE, *DEMO], timeout=LIBRARY_READ_MS)
        view.max_tokens.setValue(2)
        view.results_dir = tmp_path / "runs"
        with qtbot.waitSignal(view.runFinished, timeout=120_000):
            qtbot.mouseClick(view.run_button, Qt.MouseButton.LeftButton)
        assert view.banner.text == "", view.banner.text
        assert view.results is not None and view.results.prompt_set == "demo-prompts"
        assert (view.matrix.rowCount(), view.matrix.columnCount()) == (6, 1 + len(DEMO))
        view.path.clear()
        assert button.isVisible()
    finally:
        window.close()
