"""The lifecycle in the Library view on a real registry and engine: retire (listed, no longer
served), archive and restore (the same files), reactivate (served again), warm at start (read
into host RAM), each step in the adapter's history in the details pane; an alias added in the view
is served at once, and its warm list is read on its first use."""

from __future__ import annotations

from multilora_studio.util import sha256_file
from tests.gui.conftest import save_screenshot, wait_task


def served(window) -> set[str]:
    return {info.name for info in window.host.engine.list_adapters()}


def test_retire_archive_restore_reactivate_and_warm_in_the_view(qtbot, open_window, tiny_adapters):
    window = open_window()
    library = window.library
    window.show_page("Library")
    for name in ("tiny-r4-qv", "tiny-r8-all"):
        wait_task(qtbot, library.import_folder(tiny_adapters[name]))
    record = library.registry.get("tiny-r4-qv")
    files = {p.name: sha256_file(p) for p in record.path.iterdir()}
    assert library.row_of("tiny-r4-qv")["State"] == "active" and "tiny-r4-qv" in served(window)

    wait_task(qtbot, library.change_state("tiny-r4-qv", "retire", "replaced by v2"))
    assert library.banner.kind == "success", library.banner.text
    assert library.row_of("tiny-r4-qv")["State"] == "retired" and "tiny-r4-qv" not in served(window)
    assert library.select("tiny-r4-qv") and library.retire_button.text() == "Reactivate"
    assert "replaced by v2" in library.details.toPlainText()

    wait_task(qtbot, library.change_state("tiny-r4-qv", "archive", "cold"))
    assert library.row_of("tiny-r4-qv")["State"] == "archived" and not record.path.exists()
    assert library.select("tiny-r4-qv")
    assert library.archive_button.text() == "Restore" and not library.retire_button.isEnabled()
    wait_task(qtbot, library.change_state("tiny-r4-qv", "restore"))
    assert {p.name: sha256_file(p) for p in record.path.iterdir()} == files  # byte for byte
    wait_task(qtbot, library.change_state("tiny-r4-qv", "reactivate", "needed again"))
    assert library.row_of("tiny-r4-qv")["State"] == "active" and "tiny-r4-qv" in served(window)

    wait_task(qtbot, library.set_warm("tiny-r8-all", True))
    assert library.row_of("tiny-r8-all")["State"] == "active, warm"
    qtbot.waitUntil(
        lambda: "tiny-r8-all" in window.host.engine.metrics(fresh=True).cpu_adapters, timeout=30_000
    )
    assert library.select("tiny-r4-qv")
    history = library.details.toPlainText()
    for event in ("registered", "retired", "archived", "restored", "reactivated", "needed again"):
        assert event in history
    save_screenshot(window, "library-lifecycle")

    wait_task(qtbot, library.change_state("tiny-r8-all", "reactivate"))  # not retired: refused
    assert library.banner.kind == "error" and "only a retired adapter" in library.banner.text
    assert "tiny-r8-all" in served(window)

    assert library.select("tiny-r8-all") and not library.alias_warm_button.isEnabled()  # no alias
    wait_task(qtbot, library.add_alias("tiny-r4-qv", "support"))
    pool = window.host.pool
    assert pool.base_of("support") == (window.host.engine.model_name, "tiny-r4-qv")  # served at once
    assert library.select("tiny-r4-qv") and library.alias_warm_button.isEnabled()
    wait_task(qtbot, library.set_warm("tiny-r8-all", False))
    wait_task(qtbot, library.change_state("tiny-r8-all", "retire"))  # leaves host RAM
    wait_task(qtbot, library.change_state("tiny-r8-all", "reactivate"))
    assert "tiny-r8-all" not in window.host.engine.metrics(fresh=True).cpu_adapters
    wait_task(qtbot, library.set_alias_warm("support", ["tiny-r8-all"]))
    assert library.banner.text == "The first request by 'support' reads tiny-r8-all."
    assert library.select("tiny-r4-qv") and "support (warms tiny-r8-all)" in library.details.toPlainText()
    reading = pool.warm_alias("support", window.host.engine)  # what the endpoint's first request does
    assert reading is not None
    reading.join(30)
    assert "tiny-r8-all" in window.host.engine.metrics(fresh=True).cpu_adapters
