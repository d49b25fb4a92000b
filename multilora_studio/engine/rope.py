"""Rotary position embedding tables (HF 'rotate half' layout) with llama3 / linear scaling."""

from __future__ import annotations

import math

import torch

from multilora_studio.engine.model_spec import RopeSpec


def inverse_frequencies(spec: RopeSpec, head_dim: int) -> torch.Tensor:
    """[head_dim // 2] float32 inverse frequencies after the configured scaling (as HF computes them)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv = 1.0 / (spec.theta**exponents)
    if spec.kind == "linear":
        return inv / spec.factor
    if spec.kind == "llama3":
        low_wavelen = spec.original_max_position / spec.low_freq_factor
        high_wavelen = spec.original_max_position / spec.high_freq_factor
        wavelen = 2 * math.pi / inv
        smooth = (spec.original_max_position / wavelen - spec.low_freq_factor) / (
            spec.high_freq_factor - spec.low_freq_factor
        )
        mid = (1 - smooth) * inv / spec.factor + smooth * inv
        scaled = torch.where(wavelen > low_wavelen, inv / spec.factor, inv)
        is_mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(is_mid, mid, scaled)
    return inv


def cos_sin_cache(spec: RopeSpec, head_dim: int, max_positions: int, device: torch.device) -> torch.Tensor:
    """[max_positions, head_dim] float32: cos in the first half, sin in the second."""
    inv = inverse_frequencies(spec, head_dim)
    angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv)  # [P, D/2]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(device)
