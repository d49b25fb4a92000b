"""Base weights of a Llama-family checkpoint, loaded from HF safetensors into fused tensors.

Fused projections (qkv, gate_up) are filled from their HF parts by a data table
(``PACKED_MODULES``), each part copied straight from the memory-mapped file into
its rows of the fused tensor.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from multilora_studio.engine.model_spec import ModelSpec
from multilora_studio.kernels.cpu_linear import pack_weight

# fused name -> its HF parts in row order
PACKED_MODULES = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}
PLAIN_MODULES = ("self_attn.o_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm")


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [H]
    qkv: torch.Tensor  # [q + 2 kv, H]
    qkv_bias: torch.Tensor | None  # [q + 2 kv]
    o: torch.Tensor  # [H, q]
    post_norm: torch.Tensor  # [H]
    gate_up: torch.Tensor  # [2 I, H]
    down: torch.Tensor  # [H, I]


@dataclass
class ModelWeights:
    embed: torch.Tensor  # [V, H]
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # [H]
    lm_head: torch.Tensor  # [V, H] (the embedding itself when tied)
    onednn_packed: bool = False  # GEMM weights in oneDNN's blocked layout (CPU): read by packed_linear only


def pack_for_onednn(weights: ModelWeights) -> None:
    """Reorder every GEMM weight (qkv, o, gate_up, down, lm_head) into oneDNN's layout, in place.

    The embedding stays row-major for lookups; a tied lm_head gets its own packed copy.
    """
    for layer in weights.layers:
        layer.qkv = pack_weight(layer.qkv)
        layer.o = pack_weight(layer.o)
        layer.gate_up = pack_weight(layer.gate_up)
        layer.down = pack_weight(layer.down)
    weights.lm_head = pack_weight(weights.lm_head)
    weights.onednn_packed = True


def _shard_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / name for name in names]
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    if any(folder.glob("*.bin")) or any(folder.glob("*.pt")):
        raise ValueError(
            f"{folder} holds only pickle weights (.bin/.pt), which can run code when loaded; "
            "convert them to safetensors first"
        )
    raise FileNotFoundError(f"{folder} has no model.safetensors")


class _TensorSource:
    """Name -> tensor over all shards, memory-mapped."""

    def __init__(self, files: list[Path]) -> None:
        self._handles = [safe_open(str(path), framework="pt") for path in files]
        self._where = {name: handle for handle in self._handles for name in handle.keys()}  # noqa: SIM118

    def has(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise ValueError(f"checkpoint lacks tensor {name!r}")
        return self._where[name].get_tensor(name)


def load_weights(folder: Path, spec: ModelSpec, dtype: torch.dtype, device: torch.device) -> ModelWeights:
    """Read the checkpoint at ``folder`` into fused tensors on ``device``."""
    source = _TensorSource(_shard_files(Path(folder)))

    def take(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        tensor = source.get(name)
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, config.json implies {shape}")
        return tensor.to(device=device, dtype=dtype)

    def fused(prefix: str, parts: tuple[str, ...], suffix: str = "weight") -> torch.Tensor:
        pieces = [source.get(f"{prefix}.{part}.{suffix}") for part in parts]
        rows = sum(piece.shape[0] for piece in pieces)
        out = torch.empty((rows, *pieces[0].shape[1:]), dtype=dtype, device=device)
        row = 0
        for piece in pieces:
            out[row : row + piece.shape[0]].copy_(piece)
            row += piece.shape[0]
        return out

    hidden, inter = spec.hidden_size, spec.intermediate_size
    qkv_rows = spec.q_size + 2 * spec.kv_size
    layers = []
    for index in range(spec.num_layers):
        prefix = f"model.layers.{index}"
        qkv = fused(prefix, PACKED_MODULES["self_attn.qkv_proj"])
        gate_up = fused(prefix, PACKED_MODULES["mlp.gate_up_proj"])
        if qkv.shape != (qkv_rows, hidden) or gate_up.shape != (2 * inter, hidden):
            raise ValueError(f"layer {index}: fused projection shapes do not match config.json")
        layers.append(
            LayerWeights(
                input_norm=take(f"{prefix}.input_layernorm.weight", (hidden,)),
                qkv=qkv,
                qkv_bias=fused(prefix, PACKED_MODULES["self_attn.qkv_proj"], "bias")
                if spec.attention_bias
                else None,
                o=take(f"{prefix}.self_attn.o_proj.weight", (hidden, spec.q_size)),
                post_norm=take(f"{prefix}.post_attention_layernorm.weight", (hidden,)),
                gate_up=gate_up,
                down=take(f"{prefix}.mlp.down_proj.weight", (hidden, inter)),
            )
        )
    embed = take("model.embed_tokens.weight", (spec.vocab_size, hidden))
    if spec.tie_word_embeddings or not source.has("lm_head.weight"):
        lm_head = embed
    else:
        lm_head = take("lm_head.weight", (spec.vocab_size, hidden))
    return ModelWeights(embed, layers, take("model.norm.weight", (hidden,)), lm_head)


def random_weights(spec: ModelSpec, dtype: torch.dtype, device: torch.device, seed: int = 0) -> ModelWeights:
    """Random weights of the right shapes (benchmarks of large shapes without a download)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    std = spec.hidden_size**-0.5

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(shape, generator=generator, device=device, dtype=torch.float32) * std).to(dtype)

    def ones(size: int) -> torch.Tensor:
        return torch.ones(size, device=device, dtype=dtype)

    hidden, inter = spec.hidden_size, spec.intermediate_size
    layers = [
        LayerWeights(
            input_norm=ones(hidden),
            qkv=rand(spec.q_size + 2 * spec.kv_size, hidden),
            qkv_bias=rand(spec.q_size + 2 * spec.kv_size) if spec.attention_bias else None,
            o=rand(hidden, spec.q_size),
            post_norm=ones(hidden),
            gate_up=rand(2 * inter, hidden),
            down=rand(hidden, inter),
        )
        for _ in range(spec.num_layers)
    ]
    embed = rand(spec.vocab_size, hidden)
    lm_head = embed if spec.tie_word_embeddings else rand(spec.vocab_size, hidden)
    return ModelWeights(embed, layers, ones(hidden), lm_head)
