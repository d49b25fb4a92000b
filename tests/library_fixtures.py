"""What the library's tests share: a Hub model card with evaluation results, the user's library
(where the command line finds it) with tiny adapters imported, and that library served."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from multilora_studio.adapters.base_model import BaseModelRef
from multilora_studio.adapters.registry import Registry
from multilora_studio.cli.serve import serve_library
from multilora_studio.deploy import BasePool
from multilora_studio.engine import Engine

# A PEFT adapter's card as the Hub shows them: the metadata the Hub reads, then a model-index
# with one result per benchmark (the Open LLM Leaderboard's shape: task, dataset with config,
# split and few-shot args, metrics with a type, a value and a display name, and the source).
CARD = """---
base_model: HuggingFaceTB/SmolLM2-135M-Instruct
library_name: peft
license: apache-2.0
tags:
- lora
- generated_from_trainer
datasets:
- openai/gsm8k
model-index:
- name: smol-math-lora
  results:
  - task:
      type: text-generation
      name: Text Generation
    dataset:
      name: GSM8k (5-shot)
      type: gsm8k
      config: main
      split: test
      args:
        num_few_shot: 5
    metrics:
    - type: acc
      value: 31.46
      name: accuracy
    source:
      url: https://huggingface.co/spaces/open-llm-leaderboard/open_llm_leaderboard
      name: Open LLM Leaderboard
  - task:
      type: text-generation
      name: Text Generation
    dataset:
      name: AI2 Reasoning Challenge (25-Shot)
      type: ai2_arc
      config: ARC-Challenge
      split: test
      args:
        num_few_shot: 25
    metrics:
    - type: acc_norm
      value: 43.6
      name: normalized accuracy
    - type: acc
      value: '40.1'
      name: accuracy
      verified: false
  - task:
      type: text-generation
    dataset:
      name: HellaSwag
      type: hellaswag
    metrics:
    - type: acc_norm
      value: 0.615
---

# smol-math-lora

This adapter was fine-tuned from SmolLM2-135M-Instruct on GSM8k.

## Training procedure

- learning_rate: 0.0002
- num_epochs: 3
"""
# (prompt set, metric, value) of each metric of CARD, read off it by hand
CARD_SCORES = [
    ("GSM8k (5-shot) (main, test)", "acc", 31.46),
    ("AI2 Reasoning Challenge (25-Shot) (ARC-Challenge, test)", "acc_norm", 43.6),
    ("AI2 Reasoning Challenge (25-Shot) (ARC-Challenge, test)", "acc", 40.1),
    ("HellaSwag", "acc_norm", 0.615),
]


def home_library(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    base: BaseModelRef,
    folders: dict[str, Path],
    aliases: dict[str, list[str]] | None = None,
) -> Registry:
    """The user's library (``MULTILORA_STUDIO_HOME`` under ``tmp_path``) with each of ``folders``
    imported by its name for ``base``, with its ``aliases``."""
    monkeypatch.setenv("MULTILORA_STUDIO_HOME", str(tmp_path / "home"))
    registry = Registry()
    for name, folder in folders.items():
        registry.import_folder(folder, base, name=name, aliases=(aliases or {}).get(name, ()), max_rank=32)
    return registry


@contextmanager
def served(engine: Engine, min_pass_rate: float | None = None) -> Iterator[tuple[BasePool, list[str]]]:
    """A pool of the started ``engine`` and the library adapters ``serve_library`` added to it (no
    demo adapters; ``min_pass_rate``: the quality gate), removed from the engine afterwards."""
    pool = BasePool([engine.config], started=[engine])
    added = serve_library(pool, demo_adapters=False, min_pass_rate=min_pass_rate)
    try:
        yield pool, added
    finally:
        for name in added:
            engine.remove_adapter(name)
