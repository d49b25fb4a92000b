"""The Hub and several base models, against a Hub-compatible server on loopback (olah): *Pull from
Hub…* serves the adapter on the base the Library filters by (loading it when it is swapped out);
a Hub repository is a base beside the first (pulled into the HF cache, read from it offline)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from multilora_studio.cli.shared import describe_base
from multilora_studio.engine import Engine, SamplingParams
from multilora_studio.gui.preferences import HUB_PREFIX
from tests.adapters.hub_repos import LocalRepos, model_card
from tests.adapters.hub_server import HubServer, point_client_at
from tests.gui.conftest import save_screenshot, wait_ready, wait_task

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


def test_a_hub_repository_is_another_base_online_and_offline(
    qtbot, open_window, registry, hub, qwen_base, tmp_path, monkeypatch
):
    folder, adapter = qwen_base
    local = describe_base(str(folder))
    registry.import_folder(adapter, local, name="qwen-r8", max_rank=32)  # on the same weights
    point_client_at(monkeypatch, hub.endpoint, tmp_path / "hf-cache", offline=False)
    window = open_window()
    llama = window.host.pool.names[0]
    assert window.library.row_of("qwen-r8")["Tier"] == "not served"
    settings = window.settings
    messages: list[str] = []
    window.host.progress.connect(lambda fraction, message: messages.append(message))
    window.show_page("Settings")
    settings.add_extra_model(f"{HUB_PREFIX}{QWEN_REPO}@v1")
    assert settings.apply(), settings.banner.text
    wait_ready(qtbot, window)
    pool = window.host.pool
    assert pool.names == [llama, QWEN_REPO]  # named by its repository, from the HF cache
    assert pool.base(QWEN_REPO).digest == local.digest
    assert str(tmp_path / "hf-cache") in pool.base(QWEN_REPO).config.model
    assert any(m.startswith("base 2 of 2: ") and "safetensors" in m for m in messages), messages
    assert QWEN_REPO in [m.repo_id for m in registry.list_base_models()]
    assert pool.base_of("qwen-r8") == (QWEN_REPO, "qwen-r8")
    assert window.prefs.engine_choice().extra_models == (f"{HUB_PREFIX}{QWEN_REPO}@v1",)
    save_screenshot(window, "settings-hub-base")

    # its adapter's column equals the local folder's engine with that adapter, token for token
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    with Engine(window.host.choice.engine_config(str(folder))) as engine:
        engine.add_adapter("qwen-r8", adapter)
        expected = engine.generate(["Hello there"], ["qwen-r8"], greedy)[0].token_ids
    with window.host.lease(QWEN_REPO) as engine:
        assert engine.generate(["Hello there"], ["qwen-r8"], greedy)[0].token_ids == expected

    # offline, a restart finds it in the HF cache
    point_client_at(monkeypatch, hub.endpoint, tmp_path / "hf-cache", offline=True)
    settings.max_loras.setValue(3)
    assert settings.apply()
    wait_ready(qtbot, window)
    assert (
        window.host.pool.names == [llama, QWEN_REPO]
        and window.host.pool.base(QWEN_REPO).config.max_loras == 3
    )

    # a repository that is not there, offline and online, and an adapter: not applied, the
    # running engines stay
    running = window.host.pool
    for offline, entry, says in (
        (
            True,
            "studio-tests/not-there",
            "offline (HF_HUB_OFFLINE): studio-tests/not-there@main is not in the HF cache",
        ),
        (False, "studio-tests/not-there", "studio-tests/not-there was not found"),
        (False, QWEN_LORA, f"{QWEN_LORA} is an adapter, not a base model"),
    ):
        point_client_at(monkeypatch, hub.endpoint, tmp_path / "hf-cache", offline=offline)
        settings.banner.clear()
        settings.extra_models.clear()
        settings.add_extra_model(HUB_PREFIX + entry)
        assert settings.apply()
        qtbot.waitUntil(lambda: "Not applied" in settings.banner.text, timeout=60_000)
        assert says in settings.banner.text, settings.banner.text
        assert window.host.state == "ready" and window.host.pool is running
