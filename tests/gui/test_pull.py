"""Pull dialog against a Hub-compatible server (olah) on loopback: search, pull with progress, offline."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.adapters.hub_repos import LocalRepos, model_card
from tests.adapters.hub_server import HubServer, free_port, point_client_at
from tests.gui.conftest import save_screenshot, wait_ready, wait_task

BASE_REPO = "studio-tests/tiny-llama"


@pytest.fixture
def hub(tmp_path: Path, tiny_model_dir: Path, tiny_adapters: dict[str, Path]) -> Iterator[HubServer]:
    repos = LocalRepos(tmp_path / "mirrors")
    model_files: dict[str, str | bytes | Path] = {"README.md": model_card(None, library="transformers")}
    model_files.update({p.name: p for p in tiny_model_dir.iterdir() if p.is_file()})
    repos.commit(BASE_REPO, "v1", model_files)
    repos.add_adapter("studio-tests/tiny-lora", "v1", tiny_adapters["tiny-r4-qv"], BASE_REPO, tag="v1")
    repos.add_adapter("studio-tests/tiny-mlp", "v1", tiny_adapters["tiny-r16-mlp"], "other-org/other-base")
    server = HubServer(repos.mirrors, tmp_path / "hub-server").start()
    try:
        yield server
    finally:
        server.stop()


def test_search_and_pull_an_adapter_for_the_loaded_base(
    qtbot, open_window, registry, hub, tmp_path, monkeypatch
):
    point_client_at(monkeypatch, hub.endpoint, tmp_path / "hf-cache", offline=False)
    window = open_window()
    window.show_page("Library")
    window.library.pull_button.click()
    dialog = window.pull_dialog
    assert dialog is not None and dialog.isVisible()
    dialog.base.setText(BASE_REPO)
    wait_task(qtbot, dialog.search())
    assert dialog.results.count() == 1  # only the adapter of this base
    dialog.results.setCurrentRow(0)
    assert dialog.repo.text() == "studio-tests/tiny-lora"
    fractions: list[float] = []
    task = dialog.start_pull(dialog.repo.text() + "@v1", "hub-lora")
    task.progressed.connect(lambda fraction, message: fractions.append(fraction))
    wait_task(qtbot, task)
    assert dialog.banner.kind == "success", dialog.banner.text
    assert dialog.progress.value() == 1000 and fractions and fractions == sorted(fractions)
    record = registry.get("hub-lora")
    assert record.source_kind == "hub" and record.source == "studio-tests/tiny-lora" and record.rank == 4
    qtbot.waitUntil(lambda: "hub-lora" in window.library.names(), timeout=5000)
    assert window.library.row_of("hub-lora")["Source"].startswith("Hub studio-tests/tiny-lora@")
    assert "hub-lora" in {info.name for info in window.host.engine.list_adapters()}
    save_screenshot(dialog, "pull-dialog")

    point_client_at(monkeypatch, hub.endpoint, tmp_path / "hf-cache", offline=True)
    wait_task(qtbot, dialog.search())
    assert "HF_HUB_OFFLINE" in dialog.banner.text
    wait_task(qtbot, dialog.start_pull("studio-tests/not-there"))
    assert dialog.banner.kind == "error" and "not-there" in dialog.banner.text
    assert [r.name for r in registry.list_adapters()] == ["hub-lora"]


def test_settings_start_the_engine_on_a_base_model_pulled_from_the_hub(
    qtbot, open_window, registry, hub, tmp_path, monkeypatch, tiny_model_dir
):
    point_client_at(monkeypatch, hub.endpoint, tmp_path / "hf-cache", offline=False)
    window = open_window()
    settings = window.settings
    local_digest = window.host.engine.base_digest
    messages: list[str] = []
    window.host.progress.connect(lambda fraction, message: messages.append(message))
    settings.hub.setChecked(True)
    settings.model.setText(BASE_REPO)
    assert settings.apply()
    wait_ready(qtbot, window)
    engine = window.host.engine
    assert engine.base_digest == local_digest  # the same weights, now from the HF cache
    assert str(tmp_path / "hf-cache") in str(engine.base.folder)
    assert [m.repo_id for m in registry.list_base_models()] == [BASE_REPO]
    assert any("model.safetensors" in m or "pulled base model" in m for m in messages)

    settings.model.setText("studio-tests/tiny-lora")  # an adapter is not a base model
    assert settings.apply()
    qtbot.waitUntil(lambda: "Not applied" in settings.banner.text, timeout=60_000)
    assert "adapter, not a base model" in settings.banner.text
    assert window.host.state == "ready" and window.host.engine is engine  # the running engine stays


def test_search_without_a_reachable_hub_says_so_and_a_hanging_one_can_be_cancelled(
    qtbot, open_window, tmp_path, monkeypatch
):
    window = open_window()
    window.show_page("Library")
    window.library.pull_button.click()
    dialog = window.pull_dialog
    point_client_at(monkeypatch, f"http://127.0.0.1:{free_port()}", tmp_path / "hf-cache", offline=False)
    wait_task(qtbot, dialog.search())
    assert dialog.banner.kind == "error" and "cannot reach the Hub" in dialog.banner.text
    assert dialog.search_button.isEnabled() and not dialog.cancel_button.isEnabled()

    silent = socket.socket()  # accepts connections and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    point_client_at(
        monkeypatch, f"http://127.0.0.1:{silent.getsockname()[1]}", tmp_path / "hf-cache", offline=False
    )
    try:
        search = dialog.search()
        assert dialog.cancel_button.isEnabled() and not dialog.search_button.isEnabled()
        qtbot.wait(500)
        assert not search.wait(0)  # still waiting for an answer
        dialog.cancel_button.click()
        assert dialog.search_button.isEnabled() and not dialog.cancel_button.isEnabled()
        assert dialog.status.text() == "Search cancelled."
    finally:
        silent.close()
    wait_task(qtbot, search)  # the abandoned search ends; its late answer changes nothing
    assert dialog.status.text() == "Search cancelled." and dialog.results.count() == 0
