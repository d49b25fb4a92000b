"""What each way of serving a base costs and buys, from its config.json before it loads: the
weights' bytes, the bytes a decode step reads (decode is bound by them: fewer bytes, faster
tokens), and the KV-cache tokens that fit beside the weights in a device's memory.

Formats offered: a float checkpoint as bf16, FP8 or int4 quantized at load; a quantized
checkpoint as it is. Embeddings, norms and the LM head stay bf16 in every format.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from multilora_studio.engine.model.model_spec import ModelSpec, spec_from_config
from multilora_studio.engine.model.quantization import (
    AT_LOAD,
    Quantization,
    checkpoint_quantization,
    projection_bytes,
)

__all__ = ["FormatCost", "base_format_costs", "first_gpu_memory", "format_costs", "kv_bytes_per_token"]

FLOAT_BYTES = 2  # bf16: the float parts, the KV cache


@dataclass(frozen=True)
class FormatCost:
    """One way of serving a base (module docstring)."""

    quantization: Quantization | None  # None: the float weights as they are
    weight_bytes: int  # every weight as stored on the device
    read_per_token: int  # the projections and the LM head: what one decode step reads
    kv_tokens: int | None  # KV-cache tokens beside the weights (None: no device memory given)

    @property
    def label(self) -> str:
        return "bf16" if self.quantization is None else self.quantization.label


def kv_bytes_per_token(spec: ModelSpec) -> int:
    """Bytes of K and V of one token over every layer (bf16)."""
    return 2 * spec.num_layers * spec.kv_size * FLOAT_BYTES


def format_costs(spec: ModelSpec, checkpoint: Quantization | None, memory: int | None) -> list[FormatCost]:
    """The formats a checkpoint of ``checkpoint``'s quantization can be served in and what each
    costs; ``memory``: the device's bytes, for the KV tokens that fit beside the weights."""
    offered = (
        [checkpoint] if checkpoint is not None else [None] + [Quantization(m, at_load=True) for m in AT_LOAD]
    )
    head = spec.vocab_size * spec.hidden_size * FLOAT_BYTES
    embeddings = head if spec.tie_word_embeddings else 2 * head
    norms = (2 * spec.num_layers + 1) * spec.hidden_size * FLOAT_BYTES
    costs = []
    for quantization in offered:
        _, projections = projection_bytes(spec, quantization)
        weights = projections + embeddings + norms
        room = None if memory is None else max(0, memory - weights)
        tokens = None if room is None else room // kv_bytes_per_token(spec)
        costs.append(FormatCost(quantization, weights, projections + head, tokens))
    return costs


def base_format_costs(folder: Path, memory: int | None) -> list[FormatCost]:
    """``format_costs`` of the base at ``folder`` from its config.json ([] when it cannot be
    read, or names a model or a quantization the engine does not serve)."""
    try:
        config = json.loads((Path(folder).expanduser() / "config.json").read_text())
        return format_costs(spec_from_config(config), checkpoint_quantization(config), memory)
    except (OSError, ValueError):  # json.JSONDecodeError is a ValueError
        return []


def first_gpu_memory() -> int | None:
    """The first CUDA device's memory in bytes (None without one)."""
    import torch

    return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
