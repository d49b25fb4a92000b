"""The decoder layer's elementwise ops for float32 on the CPU, compiled by Numba.

Residual-add + RMSNorm, RMSNorm, RoPE and SiLU-and-mul each took 3-8 torch operations per
call on the CPU path, about 16% of a decode step of the embedded model at batch 8 (their
arithmetic is a few microseconds). Here each is one compiled loop over the rows, without
the GIL. Same semantics as ``fused_ops``: float32 throughout. SiLU-and-mul runs here only when
asked for (``backend="numba"``): without a vectorised exp (Numba has no SVML from PyPI) torch's
SiLU is faster.
"""

from __future__ import annotations

import numpy as np
import torch

from . import lora_cpu

numba = lora_cpu.numba
AVAILABLE = lora_cpu.AVAILABLE
FASTMATH = lora_cpu.FASTMATH  # exp, sqrt, inf and NaN keep IEEE semantics


def _norm_rows(x, residual, weight, out, eps, has_residual):
    """out[t] = weight * r * rsqrt(mean(r^2) + eps), r = x[t] (+ residual[t], stored back)."""
    cols = x.shape[1]
    for t in range(x.shape[0]):
        x_row = x[t]
        o_row = out[t]
        if has_residual:
            r_row = residual[t]
            for j in range(cols):
                r_row[j] += x_row[j]
            src = r_row
        else:
            src = x_row
        total = np.float32(0.0)
        for j in range(cols):
            total += src[j] * src[j]
        inv = np.float32(1.0) / np.sqrt(total / np.float32(cols) + eps)
        for j in range(cols):
            o_row[j] = weight[j] * (src[j] * inv)


def _rope_rows(x, cos_sin, positions):
    """x [T, H, D] in place: (x1, x2) -> (x1 c - x2 s, x2 c + x1 s) at each token's position."""
    half = x.shape[2] // 2
    for t in range(x.shape[0]):
        cs = cos_sin[positions[t]]  # [D]: cos then sin
        for h in range(x.shape[1]):
            row = x[t, h]
            for d in range(half):
                x1 = row[d]
                x2 = row[half + d]
                row[d] = x1 * cs[d] - x2 * cs[half + d]
                row[half + d] = x2 * cs[d] + x1 * cs[half + d]


def _silu_mul_rows(gate_up, out):
    """out[t, j] = silu(gate_up[t, j]) * gate_up[t, I + j]."""
    half = out.shape[1]
    for t in range(gate_up.shape[0]):
        row = gate_up[t]
        o_row = out[t]
        for j in range(half):
            g = row[j]
            o_row[j] = g / (np.float32(1.0) + np.exp(-g)) * row[half + j]


if AVAILABLE:
    _norm = numba.njit(fastmath=FASTMATH, nogil=True, cache=True)(_norm_rows)
    _rope = numba.njit(fastmath=FASTMATH, nogil=True, cache=True)(_rope_rows)
    _silu_mul = numba.njit(fastmath=FASTMATH, nogil=True, cache=True)(_silu_mul_rows)


def supports(x: torch.Tensor) -> bool:
    """Whether these kernels take ``x``: float32 on the CPU, Numba present."""
    return AVAILABLE and x.dtype == torch.float32 and x.device.type == "cpu"


def _check_weight(weight: torch.Tensor, cols: int) -> None:
    if weight.shape != (cols,) or weight.dtype != torch.float32:
        raise ValueError(f"weight must be [{cols}] float32, got {tuple(weight.shape)} {weight.dtype}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    _check_weight(weight, x.shape[1])
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    _norm(x.numpy(), x.numpy(), weight.numpy(), out.numpy(), np.float32(eps), False)
    return out


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    _check_weight(weight, x.shape[1])
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    _norm(x.numpy(), residual.numpy(), weight.numpy(), out.numpy(), np.float32(eps), True)
    return out


def rope_(x: torch.Tensor, cos_sin: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    pos = positions.numpy()
    if pos.size and (pos.min() < 0 or pos.max() >= cos_sin.shape[0]):
        raise ValueError(f"positions must lie in [0, {cos_sin.shape[0]}), got {pos.min()}..{pos.max()}")
    _rope(x.numpy(), cos_sin.numpy(), pos)
    return x


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    out = torch.empty((gate_up.shape[0], gate_up.shape[1] // 2), dtype=gate_up.dtype)
    _silu_mul(gate_up.numpy(), out.numpy())
    return out


def compile_now() -> None:
    """Compile (or load from Numba's cache) the kernels for float32 rows."""
    if not AVAILABLE:
        return
    x = torch.zeros(1, 4)
    rms_norm(x, torch.ones(4), 1e-6)
    add_rms_norm(x, torch.zeros(1, 4), torch.ones(4), 1e-6)
    for tokens in (1, 2):  # the engine rotates views of the fused qkv output (strided above one row)
        rope_(
            torch.zeros(tokens, 12)[:, :4].view(tokens, 1, 4),
            torch.zeros(2, 4),
            torch.zeros(tokens, dtype=torch.int64),
        )
