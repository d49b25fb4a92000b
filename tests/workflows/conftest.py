"""Workflow-model fixtures (no Qt): base pools over the tiny model with real adapters, a library, a
store of remembered values."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from multilora_studio.adapters.registry import Registry
from multilora_studio.deploy import BasePool
from multilora_studio.engine import EngineConfig

ADAPTERS = ("tiny-r4-qv", "tiny-r8-all", "tiny-r16-mlp")
MAX_LORAS = 2  # fewer slots than ADAPTERS: ticking every adapter warns


class DictStore(dict):
    """Remembered values in a dictionary (what ``Preferences`` keeps in the user's settings)."""

    def set(self, key: str, value: Any) -> None:
        self[key] = value


def tiny_config(model: Path, device: str) -> EngineConfig:
    return EngineConfig(
        model=str(model),
        device=device,
        dtype="float32",
        max_loras=MAX_LORAS,
        max_lora_rank=32,
        max_model_len=256,
    )


@pytest.fixture(scope="module")
def pool(tiny_model_dir, tiny_adapters, engine_device) -> Iterator[BasePool]:
    """One base serving ADAPTERS; its engine starts at the first lease."""
    with BasePool([tiny_config(tiny_model_dir, engine_device)]) as built:
        for name in ADAPTERS:
            built.register_adapter(built.primary, name, tiny_adapters[name])
        yield built


@pytest.fixture
def two_bases(tiny_model_dir, tiny_adapters, engine_device, tmp_path) -> Iterator[BasePool]:
    """Two bases (the tiny model and a copy under another name), never loaded: the first serves
    ADAPTERS, the second tiny-r8-attn."""
    copy = Path(shutil.copytree(tiny_model_dir, tmp_path / "tiny-copy"))
    with BasePool([tiny_config(tiny_model_dir, engine_device), tiny_config(copy, engine_device)]) as built:
        for name in ADAPTERS:
            built.register_adapter(built.primary, name, tiny_adapters[name])
        built.register_adapter("tiny-copy", "tiny-r8-attn", tiny_adapters["tiny-r8-attn"])
        yield built


@pytest.fixture
def registry(tmp_path) -> Registry:
    return Registry(tmp_path / "library")


@pytest.fixture
def store() -> DictStore:
    return DictStore()
