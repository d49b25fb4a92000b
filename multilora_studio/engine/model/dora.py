"""DoRA's per-row output scale, magnitude / ||W + B A|| (PEFT's inference semantics).

A DoRA adapter's projection outputs ``(m / n) * (x W^T + x A^T B^T) + bias`` where ``n`` is the
row norm of ``W + B A`` (B with the LoRA scale folded in). ``n`` is computed once, when the
adapter is put in a slot, from the base weights' squared row norms (taken at load, before any
repacking) and one projection of A through the base weight:
``n_i^2 = ||W_i||^2 + 2 B_i . (A W_i^T) + B_i (A A^T) B_i^T``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from multilora_studio.engine.model.weights import ModelWeights
from multilora_studio.kernels.quant_weight import Weight, dequantize


@dataclass
class BaseProjection:
    """The base weights as DoRA's norms need them.

    ``sq_norms[group]``: [layers, out_total] float32 squared row norms of the group's weight;
    ``project(group, layer, x)``: ``x @ W^T`` [rows, out_total] for ``x`` [rows, in] (through
    the model's own GEMM, whatever layout its weights are in).
    """

    sq_norms: dict[str, torch.Tensor]
    project: Callable[[str, int, torch.Tensor], torch.Tensor]


def base_row_norms(weights: ModelWeights, groups: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """[layers, out_total] float32 squared row norms of each GEMM group of ``groups`` (the ones
    that take LoRA; read before repacking; a quantized weight's from its dequantized values, one
    projection at a time)."""

    def dense(weight: Weight) -> torch.Tensor:
        return weight.float() if isinstance(weight, torch.Tensor) else dequantize(weight, torch.float32)

    return {
        group: torch.stack([dense(getattr(layer, group)).pow(2).sum(1) for layer in weights.layers])
        for group in groups
    }


def dora_row_scale(
    magnitude: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    offsets: tuple[int, ...],
    group: str,
    base: BaseProjection,
) -> torch.Tensor:
    """[layers, out_total] ``magnitude / ||W + B A||`` per output row, 1 where ``magnitude`` is
    NaN (rows of modules the adapter does not train with DoRA).

    ``magnitude`` [L, out_total]; ``a`` [L, slices, r, in] and ``b`` [L, out_total, r] (the
    slot's factors, scale in B); ``offsets``: each slice's first row.
    """
    device = a.device
    magnitude = magnitude.to(device=device, dtype=torch.float32)
    scale = torch.ones_like(magnitude)
    slices, rank = a.shape[1], a.shape[2]
    for layer in range(magnitude.shape[0]):
        trained = ~torch.isnan(magnitude[layer])  # [out_total]
        if not bool(trained.any()):
            continue
        a_rows = a[layer].reshape(slices * rank, -1)  # [S r, in]
        projected = base.project(group, layer, a_rows).float()  # [S r, out_total]: A W^T
        for s in range(slices):
            rows = slice(offsets[s], offsets[s + 1])
            a_s = a[layer, s].float()  # [r, in]
            b_s = b[layer, rows].float()  # [out_s, r]
            cross = (b_s * projected[s * rank : (s + 1) * rank, rows].T).sum(1)  # [out_s]
            lora = ((b_s @ (a_s @ a_s.T)) * b_s).sum(1)  # [out_s]: ||B_i A||^2
            norm = (base.sq_norms[group][layer, rows].to(device) + 2 * cross + lora).clamp_min(0).sqrt()
            scale[layer, rows] = torch.where(trained[rows], magnitude[layer, rows] / norm, 1.0)
    return scale
