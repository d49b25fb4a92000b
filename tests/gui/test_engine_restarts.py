"""Restarting the engine from Settings releases the old engine, its thread and its memory."""

from __future__ import annotations

import threading
import weakref

from tests.gui.conftest import wait_ready
from tests.live_objects import live_engines

RESTARTS = 3


def engine_threads() -> int:
    return sum(thread.name == "engine-worker" for thread in threading.enumerate())


def test_restarts_leave_one_engine_and_one_engine_thread(qtbot, open_window):
    before, threads_before = len(live_engines()), engine_threads()  # engines other fixtures hold
    window = open_window()
    settings = window.settings
    first = weakref.ref(window.host.engine)
    earlier = [first]  # weak: the engines a restart replaced must be free to go
    for restart in range(RESTARTS):
        window.compare.tick_all(True)
        assert window.compare.start()  # a run in progress is stopped by the restart
        settings.max_loras.setValue(2 + restart % 2)
        assert settings.apply()
        wait_ready(qtbot, window)
        engine = window.host.engine
        # a new engine each time (ids may repeat once an old one is freed: compare objects)
        assert all(ref() is not engine for ref in earlier)
        earlier.append(weakref.ref(engine))
        del engine
        qtbot.waitUntil(lambda: engine_threads() == threads_before + 1, timeout=10_000)
        # the old engine is freed once its last references (the stopping thread's) are gone
        qtbot.waitUntil(lambda: len(live_engines()) == before + 1, timeout=10_000)
        assert window.host.engine.config.max_loras == 2 + restart % 2
    assert first() is None  # the window's first engine is gone, not held anywhere
    assert window.settings.prefs.engine_choice().max_loras == 2 + (RESTARTS - 1) % 2
