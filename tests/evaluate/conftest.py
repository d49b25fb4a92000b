"""Evaluation fixtures: one real engine a session on the tiny model with two adapters, and prompt files."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from multilora_studio.engine import Engine, EngineConfig

ADAPTERS = ("tiny-r4-qv", "tiny-r8-all")


@pytest.fixture(scope="session")
def engine(tiny_model_dir, tiny_adapters, engine_device) -> Iterator[Engine]:
    """One engine for the evaluation suite; a test that adds an adapter removes it again."""
    config = EngineConfig(
        model=str(tiny_model_dir),
        device=engine_device,
        dtype="float32",
        max_loras=4,
        max_lora_rank=32,
        max_num_seqs=16,
        max_model_len=256,
        max_num_batched_tokens=512,
    )
    with Engine(config) as built:
        for name in ADAPTERS:
            built.add_adapter(name, tiny_adapters[name])
        yield built


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
