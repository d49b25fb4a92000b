"""A 4-bit weight in the K-packed layout dequantized into a dense [K, N] matrix, for GEMMs with
many rows (prefill) that run faster on a dense weight and cuBLAS than on any 4-bit kernel.

Layout (``quant_weight``'s ``gptq`` kind, which every 4-bit weight takes on a GPU): ``qweight``
[K / 8, N] int32, row ``8 r + i`` in nibble i of word r; ``zeros`` and ``scales`` [K / G, N]
float16, the zero points unpacked (the format's offset added). Each value is computed as
``(q - z) * s`` in float32 (exact: a 4-bit integer difference times an fp16 scale) and rounded
once to the output dtype, as ``quant_weight.dequantize`` does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["dequantize_kn"]

BLOCK_K = 64
BLOCK_N = 128


@triton.jit
def _dequantize_kernel(
    qweight_ptr, zeros_ptr, scales_ptr, out_ptr, K, N,
    GROUP: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr,
):  # fmt: skip
    offs_k = tl.program_id(0) * BK + tl.arange(0, BK)  # [BK]
    offs_n = tl.program_id(1) * BN + tl.arange(0, BN)  # [BN]
    mask = (offs_k < K)[:, None] & (offs_n < N)[None, :]  # [BK, BN]
    words = tl.load(qweight_ptr + (offs_k // 8)[:, None] * N + offs_n[None, :], mask=mask, other=0)
    q = (words >> ((offs_k % 8) * 4)[:, None]) & 0xF  # [BK, BN] 0..15
    meta = (offs_k // GROUP)[:, None] * N + offs_n[None, :]
    z = tl.load(zeros_ptr + meta, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(scales_ptr + meta, mask=mask, other=0.0).to(tl.float32)
    w = (q.to(tl.float32) - z) * s
    tl.store(out_ptr + offs_k[:, None] * N + offs_n[None, :], w.to(out_ptr.dtype.element_ty), mask=mask)


def dequantize_kn(
    qweight: torch.Tensor,
    zeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    out: torch.Tensor,
) -> torch.Tensor:
    """qweight [K / 8, N] int32, zeros / scales [K / G, N] -> ``out`` [K, N] (its dtype), returned."""
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    meta = (k // group_size, n)
    if tuple(out.shape) != (k, n) or tuple(zeros.shape) != meta or tuple(scales.shape) != meta:
        raise ValueError(
            f"dequantize_kn: out {tuple(out.shape)} / meta {tuple(scales.shape)} for a [{k}, {n}] weight"
        )
    grid = (triton.cdiv(k, BLOCK_K), triton.cdiv(n, BLOCK_N))
    _dequantize_kernel[grid](qweight, zeros, scales, out, k, n, GROUP=group_size, BK=BLOCK_K, BN=BLOCK_N)
    return out
