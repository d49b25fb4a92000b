"""The Library view reads the library on a task thread: a refresh returns at once, the table
follows when the read is shown (``refreshed``), and refreshes asked for meanwhile share one
more read."""

from __future__ import annotations

import threading
from pathlib import Path

from multilora_studio.adapters.registry import Registry
from multilora_studio.adapters.registry_schema import AdapterRecord
from multilora_studio.gui.engine_host import EngineHost
from multilora_studio.gui.library_view import LibraryView


class ReadThreads(Registry):
    """A real library that notes which thread read all of it, each time."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.readers: list[threading.Thread] = []

    def list_adapters(self) -> list[AdapterRecord]:
        self.readers.append(threading.current_thread())
        return super().list_adapters()


def test_a_refresh_reads_off_the_gui_thread_and_shows_what_changed(qtbot, tmp_path, tiny_base, tiny_adapters):
    library = ReadThreads(tmp_path / "library")
    library.import_folder(tiny_adapters["tiny-r4-qv"], tiny_base, name="qv")
    host = EngineHost(library, demo_adapters=False)
    view = LibraryView(host)
    qtbot.addWidget(view)
    assert view.names() == ["qv"]
    library.import_folder(tiny_adapters["tiny-r8-attn"], tiny_base, name="attn")  # by another window
    library.readers.clear()
    with qtbot.waitSignal(view.refreshed, timeout=30_000):
        host.reload_adapters()
        assert view.names() == ["qv"] and view.reading  # not read yet: on its way
    assert sorted(view.names()) == ["attn", "qv"]
    assert library.readers and threading.main_thread() not in library.readers
    qtbot.waitUntil(lambda: not view.reading, timeout=30_000)

    library.readers.clear()
    library.set_pinned("qv")
    for _ in range(3):  # one read runs, the other two asks share the one after it
        view.refresh()
    qtbot.waitUntil(lambda: not view.reading and len(library.readers) == 2, timeout=30_000)
    assert len(library.readers) == 2 and view.row_of("qv")["Pinned"] == "yes"
