"""A mixture-of-experts layer's router and experts, read from either checkpoint layout.

Per-expert tensors (``mlp.experts.N.gate_proj/up_proj/down_proj.weight`` of Qwen3-MoE,
``block_sparse_moe.experts.N.w1/w3/w2.weight`` of Mixtral) and transformers 5's fused ones
(``mlp.experts.gate_up_proj`` [E, 2 I, H], ``mlp.experts.down_proj`` [E, H, I]) load into the
same stacked tensors; the router is ``<block>.gate.weight`` [E, H].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from multilora_studio.engine.model.model_spec import ModelSpec

# where a layer keeps its experts, and each per-expert layout's (gate, up, down) names
MOE_BLOCKS = ("mlp", "block_sparse_moe")
EXPERT_PARTS = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))


@dataclass
class ExpertWeights:
    """One layer's router and experts, stacked over experts (transformers 5's fused layout).

    router: [E, H]
    gate_up: [E, 2 I, H]   (each expert's gate rows, then its up rows)
    down: [E, H, I]
    """

    router: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


def load_expert_weights(
    has: Callable[[str], bool],
    get: Callable[[str], torch.Tensor],
    layer_prefix: str,
    spec: ModelSpec,
    dtype: torch.dtype,
    device: torch.device,
) -> ExpertWeights:
    """Layer ``layer_prefix``'s router and experts from a checkpoint whose tensors ``has`` tells
    and ``get`` reads; ValueError names a missing or misshapen tensor."""
    assert spec.moe is not None
    experts, inter, hidden = spec.moe.num_experts, spec.moe.intermediate_size, spec.hidden_size
    block = next((b for b in MOE_BLOCKS if has(f"{layer_prefix}.{b}.gate.weight")), None)
    if block is None:
        raise ValueError(f"checkpoint lacks tensor '{layer_prefix}.mlp.gate.weight', the layer's router")
    prefix = f"{layer_prefix}.{block}"

    def take(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        tensor = get(name)
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, config.json implies {shape}")
        return tensor.to(device=device, dtype=dtype)

    router = take(f"{prefix}.gate.weight", (experts, hidden))  # [E, H]
    if has(f"{prefix}.experts.gate_up_proj"):  # transformers 5's fused layout
        gate_up = take(f"{prefix}.experts.gate_up_proj", (experts, 2 * inter, hidden))  # [E, 2 I, H]
        down = take(f"{prefix}.experts.down_proj", (experts, hidden, inter))  # [E, H, I]
        return ExpertWeights(router, gate_up, down)
    gate_name, up_name, down_name = next(
        (parts for parts in EXPERT_PARTS if has(f"{prefix}.experts.0.{parts[0]}.weight")), EXPERT_PARTS[0]
    )
    gate_up = torch.empty((experts, 2 * inter, hidden), dtype=dtype, device=device)  # [E, 2 I, H]
    down = torch.empty((experts, hidden, inter), dtype=dtype, device=device)  # [E, H, I]
    for e in range(experts):
        expert = f"{prefix}.experts.{e}"
        gate_up[e, :inter] = take(f"{expert}.{gate_name}.weight", (inter, hidden))
        gate_up[e, inter:] = take(f"{expert}.{up_name}.weight", (inter, hidden))
        down[e] = take(f"{expert}.{down_name}.weight", (hidden, inter))
    return ExpertWeights(router, gate_up, down)


def random_expert_weights(spec: ModelSpec, rand: Callable[..., torch.Tensor]) -> ExpertWeights:
    """Random router and experts of ``spec``'s shapes from ``rand(*shape)``."""
    assert spec.moe is not None
    experts, inter, hidden = spec.moe.num_experts, spec.moe.intermediate_size, spec.hidden_size
    return ExpertWeights(
        rand(experts, hidden), rand(experts, 2 * inter, hidden), rand(experts, hidden, inter)
    )
