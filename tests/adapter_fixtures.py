"""Adapter-library fixtures for every suite (a plugin of tests/conftest.py): the tiny base as a
BaseModelRef, a library on a real SQLite file, real PEFT variants of the tiny model, and a
Hub-compatible server (olah) on loopback."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from multilora_studio.adapters.base_model import BaseModelRef
from multilora_studio.adapters.hub import HubSettings
from multilora_studio.adapters.registry import Registry
from multilora_studio.cli.shared import describe_base
from tests.adapters.hub_repos import LocalRepos, model_card
from tests.adapters.hub_server import HubServer, point_client_at
from tests.fixtures import ATTENTION_TARGETS, MLP_TARGETS, AdapterSpec, build_adapter

HUB_ORG = "studio-tests"
BASE_REPO = f"{HUB_ORG}/tiny-llama"
OTHER_BASE = "other-org/other-base"
BIG_RANK = 6144  # 83 MB in float32: more than loopback socket buffers hold beyond the first 10 MB chunk


@pytest.fixture(scope="session")
def tiny_base(tiny_model_dir: Path) -> BaseModelRef:
    """The tiny model as the library sees it (the same path the CLI takes)."""
    return describe_base(str(tiny_model_dir))


@pytest.fixture(scope="session")
def retrained_base(tmp_path_factory, tiny_model_dir) -> Path:
    """The tiny model with one weight changed: same shapes, other digest (another base revision)."""
    folder = Path(shutil.copytree(tiny_model_dir, tmp_path_factory.mktemp("retrained") / "tiny-llama"))
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * 1.01
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    """A fresh library on a real SQLite file."""
    return Registry(tmp_path / "library")


@pytest.fixture(scope="session")
def peft_variants(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> dict[str, Path]:
    """Adapters saved by PEFT itself with contents we refuse (or accept) for the tiny model."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    cases = {
        "dora": dict(target_modules=["q_proj"], use_dora=True),
        "modules_to_save": dict(target_modules=["q_proj"], modules_to_save=["lm_head"]),
        "saved_embeddings": dict(target_modules=["q_proj"], modules_to_save=["embed_tokens", "lm_head"]),
        "embedding": dict(target_modules=["q_proj", "embed_tokens"]),
        "lm_head": dict(target_modules=["q_proj", "lm_head"]),
        "trainable_tokens": dict(target_modules=["q_proj"], trainable_token_indices=[5, 6]),
        "regex_targets": dict(target_modules=r".*\.(q|v)_proj"),
        "rank_pattern": dict(target_modules=["q_proj", "v_proj"], rank_pattern={"v_proj": 8}),
        "alpha_pattern": dict(target_modules=["q_proj", "o_proj"], alpha_pattern={"o_proj": 32}),
        "rslora": dict(target_modules=["up_proj"], use_rslora=True),
        "some_layers": dict(target_modules=["down_proj"], layers_to_transform=[1]),
    }
    root = tmp_path_factory.mktemp("peft-variants")
    folders = {}
    for label, options in cases.items():
        model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
        config = LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, task_type="CAUSAL_LM", **options)
        torch.manual_seed(7)
        get_peft_model(model, config).save_pretrained(str(root / label))
        folders[label] = root / label
    return folders


def edit_config(folder: Path, **changes: object) -> None:
    path = folder / "adapter_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def edit_tensors(folder: Path, change) -> None:
    path = folder / "adapter_model.safetensors"
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path))


@dataclass
class Hub:
    """The running Hub server and the repositories it serves."""

    endpoint: str
    repos: LocalRepos
    mirrors: Path
    root: Path


@pytest.fixture(scope="session")
def hub(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, tiny_adapters: dict[str, Path]
) -> Iterator[Hub]:
    """olah on loopback over local git repositories holding real PEFT adapters of the tiny model."""
    root = tmp_path_factory.mktemp("hub")
    repos = LocalRepos(root / "mirrors")
    made = root / "made"
    repos.add_adapter(f"{HUB_ORG}/tiny-lora", "v1", tiny_adapters["tiny-r4-qv"], BASE_REPO, tag="v1")
    repos.add_adapter(f"{HUB_ORG}/tiny-lora", "v2", tiny_adapters["tiny-r8-attn"], BASE_REPO)
    repos.add_adapter(f"{HUB_ORG}/tiny-r8-all", "v1", tiny_adapters["tiny-r8-all"], BASE_REPO)
    repos.add_adapter(f"{HUB_ORG}/tiny-mlp", "v1", tiny_adapters["tiny-r16-mlp"], OTHER_BASE)

    saved_head = shutil.copytree(tiny_adapters["tiny-r4-qv"], made / "saved-head")
    edit_config(saved_head, modules_to_save=["lm_head", "score"])  # a classification head: refused
    repos.add_adapter(f"{HUB_ORG}/tiny-saved-head", "v1", saved_head, BASE_REPO)

    broken = shutil.copytree(tiny_adapters["tiny-r4-qv"], made / "broken")
    data = (broken / "adapter_model.safetensors").read_bytes()
    (broken / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])
    repos.add_adapter(f"{HUB_ORG}/tiny-broken", "v1", broken, BASE_REPO)

    pickled = shutil.copytree(tiny_adapters["tiny-r4-qv"], made / "pickle")
    (pickled / "adapter_model.safetensors").rename(pickled / "adapter_model.bin")
    repos.add_adapter(f"{HUB_ORG}/tiny-pickle", "v1", pickled, BASE_REPO)

    spec = AdapterSpec("tiny-big", BIG_RANK, BIG_RANK, tuple(ATTENTION_TARGETS + MLP_TARGETS), 21)
    big = build_adapter(tiny_model_dir, spec, made / "big")
    repos.add_adapter(f"{HUB_ORG}/tiny-big", "v1", big, BASE_REPO)

    model_files: dict[str, str | bytes | Path] = {"README.md": model_card(None, library="transformers")}
    model_files.update({p.name: p for p in tiny_model_dir.iterdir() if p.is_file()})
    repos.commit(BASE_REPO, "v1", model_files)

    server = HubServer(repos.mirrors, root / "server").start()
    try:
        yield Hub(server.endpoint, repos, repos.mirrors, root)
    finally:
        server.stop()


@pytest.fixture
def hub_env(hub: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> HubSettings:
    """The client online against the loopback Hub, with an empty HF cache and user data directory."""
    point_client_at(monkeypatch, hub.endpoint, tmp_path / "hf-cache", offline=False)
    monkeypatch.setenv("MULTILORA_STUDIO_HOME", str(tmp_path / "home"))
    return HubSettings.from_env()
