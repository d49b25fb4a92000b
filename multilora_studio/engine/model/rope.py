"""Rotary position embedding tables (HF 'rotate half' layout) with linear, llama3, yarn and longrope
scaling, as HF's ``modeling_rope_utils`` computes them.

yarn and longrope also scale cos and sin by an attention factor. longrope has two tables, short
factors for sequences up to ``original_max_position`` and long ones beyond: ``cos_sin_cache``
stacks them (rows ``[0, P)`` short, ``[P, 2P)`` long) and ``rope_rows`` picks each token's row.
"""

from __future__ import annotations

import math

import torch

from multilora_studio.engine.model.model_spec import RopeSpec


def _yarn(spec: RopeSpec, powers: torch.Tensor, head_dim: int) -> torch.Tensor:
    """yarn over ``powers`` = theta^(2i/D) [D/2]: interpolated (``1 / (factor * power)``) below the
    correction range, extrapolated (``1 / power``) above it."""

    def correction_dim(rotations: float) -> float:
        return (head_dim * math.log(spec.original_max_position / (rotations * 2 * math.pi))) / (
            2 * math.log(spec.theta)
        )

    low, high = correction_dim(spec.beta_fast), correction_dim(spec.beta_slow)
    if spec.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # as HF: no division by zero
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp  # [D/2]
    return (1.0 / (spec.factor * powers)) * (1 - extrapolation) + (1.0 / powers) * extrapolation


def _llama3(spec: RopeSpec, inv: torch.Tensor) -> torch.Tensor:
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


def inverse_frequencies(spec: RopeSpec, head_dim: int, long: bool = False) -> torch.Tensor:
    """[head_dim // 2] float32 inverse frequencies after the configured scaling (as HF computes them).

    ``long``: longrope's long factors (sequences beyond ``original_max_position``).
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim  # [D/2]
    if spec.kind == "longrope":
        factors = spec.long_factor if long else spec.short_factor
        if len(factors) != head_dim // 2:
            raise ValueError(f"longrope needs {head_dim // 2} short and long factors, got {len(factors)}")
        return 1.0 / (torch.tensor(factors, dtype=torch.float32) * spec.theta**exponents)
    inv = 1.0 / (spec.theta**exponents)
    if spec.kind == "linear":
        return inv / spec.factor
    if spec.kind == "llama3":
        return _llama3(spec, inv)
    if spec.kind == "yarn":
        return _yarn(spec, spec.theta**exponents, head_dim)
    return inv


def attention_factor(spec: RopeSpec) -> float:
    """What cos and sin are multiplied by: yarn's and longrope's attention factor (``mscale``), else 1."""
    if spec.attention_factor is not None:
        return spec.attention_factor
    if spec.kind == "yarn":

        def mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if spec.mscale and spec.mscale_all_dim:
            return mscale(spec.factor, spec.mscale) / mscale(spec.factor, spec.mscale_all_dim)
        return mscale(spec.factor)
    if spec.kind == "longrope" and spec.factor > 1.0:
        return math.sqrt(1 + math.log(spec.factor) / math.log(spec.original_max_position))
    return 1.0


def _table(inv: torch.Tensor, max_positions: int, scale: float) -> torch.Tensor:
    angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv)  # [P, D/2]
    return torch.cat([angles.cos() * scale, angles.sin() * scale], dim=-1)  # [P, D]


def cos_sin_cache(spec: RopeSpec, head_dim: int, max_positions: int, device: torch.device) -> torch.Tensor:
    """[max_positions, head_dim] float32: cos in the first half, sin in the second, times the
    attention factor; longrope: [2 * max_positions, head_dim], the short table then the long one."""
    scale = attention_factor(spec)
    table = _table(inverse_frequencies(spec, head_dim), max_positions, scale)  # [P, D]
    if spec.kind == "longrope":
        long = _table(inverse_frequencies(spec, head_dim, long=True), max_positions, scale)  # [P, D]
        table = torch.cat([table, long])  # [2P, D]
    return table.to(device)


def rope_rows(
    spec: RopeSpec,
    positions: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_positions: int,
) -> torch.Tensor:
    """[T] rows of ``cos_sin_cache`` for tokens at ``positions`` [T]: the positions themselves, or
    for longrope, ``max_positions`` more for tokens of sequences longer than ``original_max_position``
    at this step (``seq_lens`` [S], ``query_start_loc`` [S + 1]), as HF picks the long factors."""
    if spec.kind != "longrope":
        return positions
    token = torch.arange(positions.shape[0], dtype=query_start_loc.dtype, device=positions.device)  # [T]
    seq = torch.searchsorted(query_start_loc[1:], token, right=True).clamp_(max=seq_lens.shape[0] - 1)  # [T]
    long = seq_lens[seq] > spec.original_max_position  # [T]
    return positions + long.to(positions.dtype) * max_positions
