"""Pull and search against a Hub-compatible server on loopback (olah) with the real huggingface_hub client."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from multilora_studio.adapters.hub import (
    HubError,
    HubSettings,
    PullCancelled,
    check_reachable,
    repo_cache_dir,
    search_adapters,
)
from multilora_studio.adapters.peft_adapter import AdapterError
from multilora_studio.adapters.pull import pull
from multilora_studio.adapters.registry import LibraryError, Registry
from multilora_studio.cli.shared import describe_base
from tests.adapter_fixtures import BASE_REPO, BIG_RANK, HUB_ORG, OTHER_BASE
from tests.adapters.hub_server import HubServer, free_port, point_client_at

LORA = f"{HUB_ORG}/tiny-lora"  # v1 (tag): rank 4 on q,v; main: rank 8 on attention
ADAPTERS_OF_BASE = {
    f"{HUB_ORG}/{n}"
    for n in ("tiny-lora", "tiny-r8-all", "tiny-saved-head", "tiny-broken", "tiny-pickle", "tiny-big")
}


class Recorder:
    """A progress callback that keeps what it was told."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, str]] = []

    def __call__(self, fraction: float, message: str) -> None:
        self.calls.append((fraction, message))

    @property
    def fractions(self) -> list[float]:
        return [f for f, _ in self.calls]


def cache_of(settings: HubSettings, repo_id: str) -> Path:
    return repo_cache_dir(repo_id, settings.cache_dir)


def assert_nothing_left(registry: Registry, settings: HubSettings, repo_id: str) -> None:
    assert registry.list_adapters() == []
    assert not cache_of(settings, repo_id).exists()
    assert not (settings.cache_dir / ".locks" / cache_of(settings, repo_id).name).exists()


def test_pull_registers_the_snapshot_in_the_standard_cache(hub, hub_env, registry, tiny_base, tiny_adapters):
    progress = Recorder()
    result = pull(LORA, registry, tiny_base, progress=progress)
    main = hub.repos.shas[(LORA, "v2")]
    record = result.adapter
    assert record is not None and not result.already_registered
    assert (record.name, record.source_kind, record.source) == (LORA, "hub", LORA)
    assert (record.revision, record.requested_revision, record.rank) == (main, None, 8)
    assert record.path == cache_of(hub_env, LORA) / "snapshots" / main
    weights = record.path / "adapter_model.safetensors"
    assert weights.is_symlink() and weights.resolve().parent.name == "blobs"
    assert weights.read_bytes() == (tiny_adapters["tiny-r8-attn"] / "adapter_model.safetensors").read_bytes()
    assert (cache_of(hub_env, LORA) / "refs" / "main").read_text() == main
    assert progress.fractions == sorted(progress.fractions) and progress.fractions[-1] == 1.0
    assert any("adapter_model.safetensors" in message for _, message in progress.calls)
    assert registry.get(LORA) == record


def test_revision_pins_by_tag_and_by_sha(hub, hub_env, registry, tiny_base):
    v1, main = hub.repos.shas[(LORA, "v1")], hub.repos.shas[(LORA, "v2")]
    tagged = pull(f"{LORA}@v1", registry, tiny_base, name="lora-v1").adapter
    assert tagged is not None
    assert (tagged.revision, tagged.requested_revision, tagged.rank) == (v1, "v1", 4)
    assert tagged.targets == ("q_proj", "v_proj")
    assert (cache_of(hub_env, LORA) / "refs" / "v1").read_text() == v1
    by_sha = pull(f"{LORA}@{main}", registry, tiny_base, name="lora-main").adapter
    assert by_sha is not None and (by_sha.revision, by_sha.rank) == (main, 8)
    again = pull(f"{LORA}@v1", registry, tiny_base)
    assert again.already_registered and again.adapter == tagged
    assert sorted(r.name for r in registry.list_adapters()) == ["lora-main", "lora-v1"]


def test_a_pinned_revision_keeps_its_files_when_the_branch_moves(
    hub, hub_env, registry, tiny_base, tiny_adapters
):
    repo_id = f"{HUB_ORG}/moving"
    first = hub.repos.add_adapter(repo_id, "moving-1", tiny_adapters["tiny-r4-qv"], "moving-org/base")
    old = pull(repo_id, registry, tiny_base, name="before").adapter
    second = hub.repos.add_adapter(repo_id, "moving-2", tiny_adapters["tiny-r16-mlp"], "moving-org/base")
    new = pull(repo_id, registry, tiny_base, name="after").adapter
    assert old is not None and new is not None
    assert (old.revision, new.revision) == (first, second)
    assert (registry.get("before").rank, registry.get("after").rank) == (4, 16)
    assert registry.get("before").path != registry.get("after").path
    with pytest.raises(LibraryError, match="already has an adapter or alias named 'after'"):
        pull(f"{repo_id}@{first}", registry, tiny_base, name="after")


def test_missing_repository_or_revision_is_a_clear_error(hub, hub_env, registry, tiny_base):
    with pytest.raises(HubError, match=f"{HUB_ORG}/nope was not found on {hub.endpoint}"):
        pull(f"{HUB_ORG}/nope", registry, tiny_base)
    assert_nothing_left(registry, hub_env, f"{HUB_ORG}/nope")
    with pytest.raises(HubError, match="not found"):
        pull(f"{LORA}@no-such-tag", registry, tiny_base)
    for bad in ("not a repo", "a/b/c", "org/name@", "../etc"):
        with pytest.raises(HubError, match="not a Hub repository id"):
            pull(bad, registry, tiny_base)
    assert_nothing_left(registry, hub_env, LORA)


def test_unservable_adapter_is_refused_before_its_weights_are_downloaded(hub, hub_env, registry, tiny_base):
    progress = Recorder()
    with pytest.raises(AdapterError, match="modules_to_save"):
        pull(f"{HUB_ORG}/tiny-saved-head", registry, tiny_base, progress=progress)
    assert not any("adapter_model.safetensors" in message for _, message in progress.calls)
    assert_nothing_left(registry, hub_env, f"{HUB_ORG}/tiny-saved-head")


def test_pickle_only_repository_is_refused_without_downloading(hub, hub_env, registry, tiny_base):
    with pytest.raises(HubError, match=r"only pickle weights .*adapter_model\.bin.* can run code"):
        pull(f"{HUB_ORG}/tiny-pickle", registry, tiny_base)
    assert_nothing_left(registry, hub_env, f"{HUB_ORG}/tiny-pickle")


def test_broken_file_is_refused_and_removed_from_the_cache(hub, hub_env, registry, tiny_base):
    with pytest.raises(AdapterError, match="corrupt or truncated"):
        pull(f"{HUB_ORG}/tiny-broken", registry, tiny_base)
    assert_nothing_left(registry, hub_env, f"{HUB_ORG}/tiny-broken")


def test_a_failed_pull_keeps_what_the_cache_held_before(hub, hub_env, registry, tiny_base):
    pull(f"{LORA}@v1", registry, tiny_base, name="kept")
    before = sorted(cache_of(hub_env, LORA).rglob("*"))
    registry.remove("kept")
    with pytest.raises(LibraryError, match="invalid adapter name"):
        pull(LORA, registry, tiny_base, name="base")
    with pytest.raises(AdapterError, match="exceeds max_lora_rank=4"):
        pull(LORA, registry, tiny_base, max_rank=4)  # main is rank 8: refused after its config arrived
    assert sorted(cache_of(hub_env, LORA).rglob("*")) == before
    assert registry.list_adapters() == []


def test_cancel_stops_the_transfer_and_leaves_nothing(hub, hub_env, registry, tiny_base):
    cancel = threading.Event()
    progress = Recorder()

    def on_progress(fraction: float, message: str) -> None:
        progress(fraction, message)
        if "adapter_model.safetensors" in message and fraction > 0.1:
            cancel.set()

    with pytest.raises(PullCancelled):
        pull(
            f"{HUB_ORG}/tiny-big", registry, tiny_base, max_rank=BIG_RANK, progress=on_progress, cancel=cancel
        )
    assert 0.1 < progress.fractions[-1] < 0.9  # stopped mid-file
    assert_nothing_left(registry, hub_env, f"{HUB_ORG}/tiny-big")


def test_server_killed_mid_transfer_leaves_nothing_and_a_retry_succeeds(
    hub, hub_env, registry, tiny_base, tmp_path, monkeypatch
):
    server = HubServer(hub.mirrors, tmp_path / "doomed-server").start()
    point_client_at(monkeypatch, server.endpoint, hub_env.cache_dir, offline=False)
    repo_id = f"{HUB_ORG}/tiny-big"

    def kill_during_weights(fraction: float, message: str) -> None:
        if "adapter_model.safetensors" in message and fraction > 0.1:
            server.kill()

    try:
        with pytest.raises(HubError, match=f"could not reach {server.endpoint}"):
            pull(repo_id, registry, tiny_base, max_rank=BIG_RANK, progress=kill_during_weights)
    finally:
        server.stop()
    assert_nothing_left(registry, hub_env, repo_id)
    point_client_at(monkeypatch, hub.endpoint, hub_env.cache_dir, offline=False)
    record = pull(repo_id, registry, tiny_base, max_rank=BIG_RANK).adapter
    assert record is not None and record.rank == BIG_RANK


def test_pull_a_base_model(hub, hub_env, registry, tiny_base):
    result = pull(BASE_REPO, registry, tiny_base)
    assert result.adapter is None and result.model is not None
    assert result.model.revision == hub.repos.shas[(BASE_REPO, "v1")]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in result.path.iterdir()}
    assert result.model.digest == tiny_base.digest  # same weights as the tiny model the repo was made from
    assert describe_base(str(result.path)).digest == tiny_base.digest
    assert registry.list_base_models() == [result.model]
    assert registry.list_adapters() == []


def test_pull_a_sharded_base_model_records_the_digest_the_engine_serves(
    hub, hub_env, registry, tiny_base, tiny_family_models
):
    """Shards with an index: the registry's digest covers every shard and equals the engine's."""
    sharded = tiny_family_models["llama-sharded-bf16-no-tokenizer"]
    repo_id = f"{HUB_ORG}/tiny-sharded"
    hub.repos.commit(repo_id, "v1", {p.name: p for p in sharded.iterdir() if p.is_file()})
    result = pull(repo_id, registry, tiny_base)
    assert result.model is not None and "model.safetensors.index.json" in {
        p.name for p in result.path.iterdir()
    }
    assert result.model.digest and result.model.digest == describe_base(str(sharded)).digest


def test_search_lists_the_adapters_of_a_base_model(hub, hub_env):
    found = search_adapters(BASE_REPO)
    assert {m.repo_id for m in found} >= ADAPTERS_OF_BASE
    assert f"{HUB_ORG}/tiny-mlp" not in {m.repo_id for m in found}
    assert BASE_REPO not in {m.repo_id for m in found}
    assert all(f"base_model:adapter:{BASE_REPO}" in m.tags for m in found)
    assert [m.repo_id for m in search_adapters(BASE_REPO, "r8")] == [f"{HUB_ORG}/tiny-r8-all"]
    assert len(search_adapters(BASE_REPO, limit=2)) == 2
    assert [m.repo_id for m in search_adapters(OTHER_BASE)] == [f"{HUB_ORG}/tiny-mlp"]
    assert search_adapters("nobody/nothing") == []


# hub_records/test_repos.json's downloads, by hand: neither the order of the ids nor the order of making
ADAPTERS_BY_DOWNLOADS = [
    f"{HUB_ORG}/tiny-r8-all",  # 48210
    f"{HUB_ORG}/tiny-pickle",  # 19044
    f"{HUB_ORG}/tiny-saved-head",  # 7760
    f"{HUB_ORG}/tiny-lora",  # 1523
    f"{HUB_ORG}/tiny-big",  # 310
    f"{HUB_ORG}/tiny-broken",  # 5
]


def recorded(repo_ids: list[str]) -> list[str]:
    """``repo_ids`` without the repositories other tests add to the session's Hub (no counts)."""
    return [repo_id for repo_id in repo_ids if repo_id in ADAPTERS_BY_DOWNLOADS]


def test_search_lists_the_most_downloaded_adapters_first(hub, hub_env):
    found = search_adapters(BASE_REPO)
    assert recorded([m.repo_id for m in found]) == ADAPTERS_BY_DOWNLOADS
    downloads = [m.downloads for m in found]
    assert downloads[:6] == [48210, 19044, 7760, 1523, 310, 5]
    assert downloads == sorted(downloads, reverse=True)
    assert [m.likes for m in found][:6] == [97, 8, 31, 12, 2, 0]
    # lastModified is not among the Hub's default listing fields: the search asks for it
    assert all(m.last_modified for m in found)
    assert [m.repo_id for m in search_adapters(BASE_REPO, limit=2)] == ADAPTERS_BY_DOWNLOADS[:2]


def test_the_test_hub_sorts_by_what_the_client_asks(hub, hub_env):
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub.endpoint)
    by_likes = list(api.list_models(filter=[f"base_model:adapter:{BASE_REPO}"], sort="likes"))
    assert [m.likes for m in by_likes][:6] == [97, 31, 12, 8, 2, 0]
    by_age = list(api.list_models(filter=[f"base_model:adapter:{BASE_REPO}"], sort="created_at", full=True))
    assert [m.created_at for m in by_age] == sorted((m.created_at for m in by_age), reverse=True)
    newest = next(m for m in by_age if m.id in ADAPTERS_BY_DOWNLOADS)  # newest of the recorded ones
    assert newest.id == f"{HUB_ORG}/tiny-big" and newest.sha == hub.repos.shas[(f"{HUB_ORG}/tiny-big", "v1")]


def test_the_client_searches_the_recorded_hub_records_as_on_the_hub(hub, hub_env):
    """Real Hub records (hub_records/recorded.json), read by the real client: order, limit, author, filter."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub.endpoint)
    top = list(api.list_models(filter="text-generation", sort="downloads", limit=3))
    assert [m.id for m in top] == [
        "openai-community/gpt2",
        "meta-llama/Llama-3.1-8B-Instruct",
        "meta-llama/Meta-Llama-3-8B-Instruct",
    ]
    assert [m.downloads for m in top] == [17272637, 5795728, 1127302]  # copied from the records by hand
    meta = list(api.list_models(author="meta-llama", filter=["conversational"], sort="downloads", full=True))
    assert [m.id for m in meta] == [
        "meta-llama/Llama-3.1-8B-Instruct",
        "meta-llama/Meta-Llama-3-8B-Instruct",
        "meta-llama/Meta-Llama-3-70B-Instruct",
    ]
    assert {m.gated for m in meta} == {"manual"} and all(m.author == "meta-llama" for m in meta)
    assert meta[0].sha == "0e9e39f249a16976918f6564b8830bc894c89659"
    modified = meta[0].last_modified
    assert modified is not None and modified.isoformat() == "2024-09-25T17:00:57+00:00"
    assert "model-00001-of-00004.safetensors" in {s.rfilename for s in meta[0].siblings or ()}
    zephyr = list(api.list_models(filter="base_model:finetune:mistralai/Mistral-7B-v0.1", search="ZEPHYR"))
    assert [(m.id, m.likes) for m in zephyr] == [("HuggingFaceH4/zephyr-7b-beta", 1667)]


def test_offline_mode_pulls_from_the_cache_alone(hub, hub_env, registry, tiny_base, tmp_path, monkeypatch):
    v1 = hub.repos.shas[(LORA, "v1")]
    online = pull(f"{LORA}@v1", registry, tiny_base).adapter
    assert online is not None
    point_client_at(monkeypatch, f"http://127.0.0.1:{free_port()}", hub_env.cache_dir, offline=True)
    settings = HubSettings.from_env()
    assert settings.offline
    fresh = Registry(tmp_path / "fresh-library")
    offline = pull(f"{LORA}@v1", fresh, tiny_base, settings=settings).adapter
    assert offline is not None
    assert (offline.revision, offline.path, offline.rank) == (v1, online.path, 4)
    by_sha = pull(f"{LORA}@{v1}", fresh, tiny_base, settings=settings)
    assert by_sha.already_registered
    with pytest.raises(HubError, match="not in the HF cache"):
        pull(LORA, fresh, tiny_base, settings=settings)  # main was never pulled
    with pytest.raises(HubError, match="not in the HF cache"):
        pull(f"{HUB_ORG}/tiny-r8-all", fresh, tiny_base, settings=settings)
    with pytest.raises(HubError, match="HF_HUB_OFFLINE"):
        search_adapters(BASE_REPO, settings=settings)
    assert [r.name for r in fresh.list_adapters()] == [LORA]


def test_an_unreachable_hub_is_named_at_once_and_a_listening_one_passes():
    closed = free_port()
    with pytest.raises(HubError, match=rf"cannot reach the Hub at http://127.0.0.1:{closed} .*offline"):
        check_reachable(f"http://127.0.0.1:{closed}")
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(1)
        check_reachable(f"http://127.0.0.1:{listening.getsockname()[1]}")
