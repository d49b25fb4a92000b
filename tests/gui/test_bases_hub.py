"""The Hub and several base models, against a Hub-compatible server on loopback (olah): *Pull from
Hub…* serves the adapter on the base the Library filters by (loading it when it is swapped out)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.adapters.hub_repos import LocalRepos, model_card
from tests.adapters.hub_server import HubServer, point_client_at
from tests.gui.conftest import save_screenshot, wait_task

QWEN_REPO = "studio-tests/tiny-qwen"
QWEN_LORA = "studio-tests/qwen-lora"


@pytest.fixture
def hub(tmp_path: Path, qwen_base) -> Iterator[HubServer]:
    """The tiny Qwen2 base and its adapter as Hub repositories."""
    folder, adapter = qwen_base
    repos = LocalRepos(tmp_path / "mirrors")
    model_files: dict[str, str | bytes | Path] = {"README.md": model_card(None, library="transformers")}
    model_files.update({p.name: p for p in folder.iterdir() if p.is_file()})
    repos.commit(QWEN_REPO, "v1", model_files, tag="v1")
    repos.add_adapter(QWEN_LORA, "v1", adapter, QWEN_REPO, tag="v1")
    server = HubServer(repos.mirrors, tmp_path / "hub-server").start()
    try:
        yield server
    finally:
        server.stop()


def resident(window) -> list[str]:
    return [name for name, _ in window.host.pool.resident()]


def test_a_pull_serves_the_adapter_on_the_base_the_library_filters_by(
    qtbot, open_window, two_bases, make_prefs, registry, hub, tmp_path, monkeypatch
):
    point_client_at(monkeypatch, hub.endpoint, tmp_path / "hf-cache", offline=False)
    make_prefs().set_engine_choice(replace(two_bases, max_resident_bases=1))
    window = open_window()
    pool = window.host.pool
    llama, qwen = pool.names
    assert resident(window) == [llama]
    library = window.library
    window.show_page("Library")
    qtbot.waitUntil(lambda: library.base_filter.count() == 3, timeout=10_000)
    assert library.filter_base(qwen) and library.filtered_base() == qwen
    library.pull_button.click()
    dialog = window.pull_dialog
    assert dialog.target.currentData() == qwen and not dialog.target.isHidden()
    assert dialog.base.text() == ""  # a local folder: no Hub id to search adapters of

    messages: list[str] = []
    task = dialog.start_pull(QWEN_LORA + "@v1", "hub-qwen")
    task.progressed.connect(lambda fraction, message: messages.append(message))
    wait_task(qtbot, task, 180_000)
    assert dialog.banner.kind == "success", dialog.banner.text
    assert dialog.banner.text.endswith(f"served on base model {qwen}.")
    record = registry.get("hub-qwen")
    assert record.base_digest == pool.base(qwen).digest and record.source == QWEN_LORA
    assert pool.base_of("hub-qwen") == (qwen, "hub-qwen")
    assert resident(window) == [qwen]  # swapped in for the pull
    save_screenshot(dialog, "pull-dialog-second-base")

    # pulled again for the first base (the tiny bases share their shapes): validated against
    # llama's weights and served there, qwen's copy staying on qwen
    library.filter_base(llama)
    library.pull_button.click()
    assert dialog.target.currentData() == llama
    wait_task(qtbot, dialog.start_pull(QWEN_LORA + "@v1", "hub-qwen-on-llama"), 180_000)
    assert dialog.banner.text.endswith(f"served on base model {llama}."), dialog.banner.text
    assert registry.get("hub-qwen-on-llama").base_digest == pool.base(llama).digest
    assert pool.base_of("hub-qwen-on-llama") == (llama, "hub-qwen-on-llama")
    assert pool.base_of("hub-qwen") == (qwen, "hub-qwen") and resident(window) == [llama]
