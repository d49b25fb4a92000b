"""Triton kernels behind :mod:`multilora_studio.kernels.lora` (shrink / expand).

Model code never imports this module: it calls the wrappers in ``lora``, which check
shapes, dtypes and devices and then call the launchers here.

Both kernels run on a fixed grid that depends only on tensor shapes (never on which slots
the tokens use), so one CUDA graph per batch-size bucket replays any adapter mix:

* grid axis 2 walks the slots; a program whose slot has no token in its row block, or
  whose rank block lies beyond the slot's rank, returns at once;
* tokens of a slot are read through ``LoRABatch.sorted_tokens`` (SGMV-style groups: a
  prefill request's tokens share a tile; in decode each token is its own group, BGMV);
* ``tl.dot`` tiles are at least 16 wide; small ranks (4, 8) and short token groups are
  padded inside the kernel by masks, never by padding weights.

Shrink splits ``in_features`` across programs (split-K: decode has few tokens, a large K
and a small rank) and writes one float32 partial per split; expand sums the partials as it
loads them. No atomics, so results are bitwise reproducible and graph replay equals eager.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import torch
import triton
import triton.language as tl

from .lora import MAX_SLICES, LoRABatch, _interpreting


@dataclass(frozen=True)
class ShrinkConfig:
    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int = 4
    num_stages: int = 3


@dataclass(frozen=True)
class ExpandConfig:
    block_m: int
    block_n: int
    n_iters: int = 1
    num_warps: int = 4
    num_stages: int = 2


@triton.jit
def _lora_shrink_kernel(
    x_ptr,
    a_ptr,
    out_ptr,
    sorted_ptr,
    starts_ptr,
    counts_ptr,
    ranks_ptr,
    num_tokens,
    in_features,
    max_rank,
    num_cols,
    n_blocks,
    k_per_split,
    stride_xt,
    stride_xk,
    stride_al,
    stride_as,
    stride_ar,
    stride_ak,
    stride_op,
    stride_os,
    stride_ot,
    stride_or,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    # Output columns are (slice, rank) pairs: col = s * max_rank + r, num_cols = S * R,
    # so all slices of a fused projection share one pass over x.
    pid = tl.program_id(0)
    split = tl.program_id(1)
    slot = tl.program_id(2)
    count = tl.load(counts_ptr + slot)
    rank = tl.load(ranks_ptr + slot)
    m_block = pid // n_blocks
    n_block = pid % n_blocks
    if m_block * BLOCK_M >= count:
        return
    cols = n_block * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    sl = cols // max_rank
    r = cols % max_rank
    col_in = cols < num_cols
    col_ok = col_in & (r < rank)
    if tl.max(col_ok.to(tl.int32), axis=0) == 0:
        return  # rank block beyond this slot's rank
    start = tl.load(starts_ptr + slot)
    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    m_ok = offs_m < count
    tok = tl.load(sorted_ptr + start + offs_m, mask=m_ok, other=0)
    m_ok = m_ok & (tok < num_tokens)
    tok = tok.to(tl.int64)

    k_start = split * k_per_split
    offs_k = k_start + tl.arange(0, BLOCK_K)  # [BK]
    x_ptrs = x_ptr + tok[:, None] * stride_xt + offs_k[None, :] * stride_xk  # [BM, BK]
    a_ptrs = (
        a_ptr
        + slot.to(tl.int64) * stride_al
        + sl[None, :] * stride_as
        + r[None, :] * stride_ar
        + offs_k[:, None] * stride_ak
    )  # [BK, BN]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, k_per_split, BLOCK_K):
        if EVEN_K:
            xt = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
            at = tl.load(a_ptrs, mask=col_ok[None, :], other=0.0)
        else:
            k_ok = offs_k + k < in_features
            xt = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            at = tl.load(a_ptrs, mask=col_ok[None, :] & k_ok[:, None], other=0.0)
        if UPCAST:
            xt = xt.to(tl.float32)
            at = at.to(tl.float32)
        acc += tl.dot(xt, at, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K * stride_xk
        a_ptrs += BLOCK_K * stride_ak

    out_ptrs = (
        out_ptr
        + split * stride_op
        + sl[None, :] * stride_os
        + tok[:, None] * stride_ot
        + r[None, :] * stride_or
    )  # [BM, BN]
    tl.store(out_ptrs, acc, mask=m_ok[:, None] & col_in[None, :])


@triton.jit
def _lora_expand_kernel(
    buf_ptr,
    b_ptr,
    y_ptr,
    sorted_ptr,
    starts_ptr,
    counts_ptr,
    ranks_ptr,
    num_tokens,
    num_splits,
    n_progs,
    n_iters,
    off0,
    off1,
    off2,
    off3,
    off4,
    stride_bp,
    stride_bs,
    stride_bt,
    stride_br,
    stride_wl,
    stride_wn,
    stride_wr,
    stride_yt,
    stride_yn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    # Each program: one slot, one slice, BLOCK_M of the slot's tokens and n_iters
    # consecutive BLOCK_N-wide column tiles of the slice (the rank-r rows of h stay in
    # L1 across the tiles).
    pid = tl.program_id(0)
    s = tl.program_id(1)
    slot = tl.program_id(2)
    count = tl.load(counts_ptr + slot)
    rank = tl.load(ranks_ptr + slot)
    m_block = pid // n_progs
    n_prog = pid % n_progs
    if (m_block * BLOCK_M >= count) | (rank == 0):
        return
    # Output columns of slice s: [lo, hi) (slice offsets are launch constants).
    lo = tl.where(s == 0, off0, tl.where(s == 1, off1, tl.where(s == 2, off2, off3)))
    hi = tl.where(s == 0, off1, tl.where(s == 1, off2, tl.where(s == 2, off3, off4)))
    n_first = lo + n_prog * n_iters * BLOCK_N
    if n_first >= hi:
        return
    start = tl.load(starts_ptr + slot)
    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    m_ok = offs_m < count
    tok = tl.load(sorted_ptr + start + offs_m, mask=m_ok, other=0)
    m_ok = m_ok & (tok < num_tokens)
    tok = tok.to(tl.int64)
    offs_r = tl.arange(0, BLOCK_R)  # [BR]
    buf_base = buf_ptr + s * stride_bs + tok[:, None] * stride_bt + offs_r[None, :] * stride_br
    w_base = b_ptr + slot.to(tl.int64) * stride_wl + offs_r[:, None] * stride_wr  # [BR, 1]
    y_base = y_ptr + tok[:, None] * stride_yt  # [BM, 1]

    for it in range(0, n_iters):
        offs_n = n_first + it * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
        n_ok = offs_n < hi
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for r0 in range(0, rank, BLOCK_R):  # only the slot's rank blocks
            r_ok = offs_r + r0 < rank
            h = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
            for p in range(0, num_splits):  # sum the shrink's split-K partials
                h += tl.load(
                    buf_base + p * stride_bp + r0 * stride_br,
                    mask=m_ok[:, None] & r_ok[None, :],
                    other=0.0,
                )
            w = tl.load(
                w_base + r0 * stride_wr + offs_n[None, :] * stride_wn,
                mask=r_ok[:, None] & n_ok[None, :],
                other=0.0,
            )  # [BR, BN]
            h = h.to(w.dtype)
            if UPCAST:
                h = h.to(tl.float32)
                w = w.to(tl.float32)
            acc += tl.dot(h, w, input_precision=DOT_PRECISION)
        y_ptrs = y_base + offs_n[None, :] * stride_yn  # [BM, BN]
        mask = m_ok[:, None] & n_ok[None, :]
        y_old = tl.load(y_ptrs, mask=mask, other=0.0)
        # y += delta.to(y.dtype); the sum in float32, rounded once (as a bf16/fp16 add does).
        delta = acc.to(y_old.dtype).to(tl.float32)
        tl.store(y_ptrs, (y_old.to(tl.float32) + delta).to(y_old.dtype), mask=mask)


# --------------------------------------------------------------------------- launchers


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


def _upcast(dtype: torch.dtype) -> bool:
    # Triton's interpreter multiplies bfloat16 tiles as their raw uint16 bits; give it
    # float32 tiles holding the same bfloat16 values (exact products, fp32 sums, as on GPU).
    return dtype == torch.bfloat16 and _interpreting()


def shrink_config(num_tokens: int, in_features: int, num_cols: int, num_slots: int) -> ShrinkConfig:
    """Tile sizes for a shrink launch, from shapes only (so graphs stay valid)."""
    block_n = min(64, max(16, _next_pow2(num_cols)))
    if num_tokens <= 16:
        block_m = 16
    elif num_tokens <= 256:
        block_m = 32
    else:
        block_m = 64
    block_k = 128 if block_m <= 32 else 64
    # Split K so that decode (few tokens, few rows of A per slot) still has enough
    # programs in flight; each split reads at least 512 columns.
    m_blocks = max(1, min(num_slots, num_tokens))
    n_blocks = triton.cdiv(num_cols, block_n)
    want = 1024
    split_k = 1
    while (
        m_blocks * n_blocks * split_k < want
        and in_features // (split_k * 2) >= max(512, block_k)
        and split_k < 32
    ):
        split_k *= 2
    return ShrinkConfig(block_m, block_n, block_k, split_k)


def expand_config(num_tokens: int, out_total: int, max_rank: int) -> ExpandConfig:
    """Tile sizes for an expand launch, from shapes only."""
    if num_tokens <= 16:
        return ExpandConfig(block_m=16, block_n=128)
    if num_tokens <= 256:
        return ExpandConfig(block_m=32, block_n=128)
    return ExpandConfig(block_m=64, block_n=128, num_warps=8)


def shrink_partials(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    batch: LoRABatch,
    out: torch.Tensor | None = None,
    config: ShrinkConfig | None = None,
) -> torch.Tensor:
    """Launch the shrink kernel; returns float32 partials ``[split_k, S, T, R]``.

    ``out`` (when given, split_k must be 1) is ``[S, T, R]`` and is filled directly.
    """
    num_tokens, in_features = x.shape
    num_slots, num_slices, max_rank, _ = lora_a.shape
    num_cols = num_slices * max_rank
    cfg = config or shrink_config(num_tokens, in_features, num_cols, num_slots)
    split_k = cfg.split_k if out is None else 1
    k_per_split = triton.cdiv(triton.cdiv(in_features, split_k), cfg.block_k) * cfg.block_k
    split_k = triton.cdiv(in_features, k_per_split)
    if out is None:
        part = torch.empty((split_k, num_slices, num_tokens, max_rank), dtype=torch.float32, device=x.device)
    else:
        part = out.unsqueeze(0)
    if num_tokens == 0:
        return part
    n_blocks = triton.cdiv(num_cols, cfg.block_n)
    grid = (triton.cdiv(num_tokens, cfg.block_m) * n_blocks, split_k, num_slots)
    _lora_shrink_kernel[grid](
        x,
        lora_a,
        part,
        batch.sorted_tokens,
        batch.slot_starts,
        batch.slot_counts,
        batch.slot_ranks,
        num_tokens,
        in_features,
        max_rank,
        num_cols,
        n_blocks,
        k_per_split,
        *x.stride(),
        *lora_a.stride(),
        *part.stride(),
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        EVEN_K=in_features % k_per_split == 0,
        DOT_PRECISION=_precision(x.dtype),
        UPCAST=_upcast(x.dtype),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return part


def shrink(x: torch.Tensor, lora_a: torch.Tensor, batch: LoRABatch, out: torch.Tensor) -> torch.Tensor:
    """Shrink into ``out [S, T, R]``: split-K partials are summed by one torch op."""
    num_tokens, in_features = x.shape
    num_slots, num_slices, max_rank, _ = lora_a.shape
    cfg = shrink_config(num_tokens, in_features, num_slices * max_rank, num_slots)
    if cfg.split_k == 1:
        shrink_partials(x, lora_a, batch, out=out, config=cfg)
        return out
    part = shrink_partials(x, lora_a, batch, config=cfg)
    return torch.sum(part, dim=0, out=out)


def expand(
    y: torch.Tensor,
    buf: torch.Tensor,
    lora_b: torch.Tensor,
    batch: LoRABatch,
    slice_offsets: tuple[int, ...],
    config: ExpandConfig | None = None,
) -> torch.Tensor:
    """Launch the expand kernel: ``buf`` is float32 partials ``[split, S, T, R]``."""
    split, num_slices, num_tokens, max_rank = buf.shape
    if num_slices > MAX_SLICES:
        raise ValueError(f"at most {MAX_SLICES} slices per launch, got {num_slices}")
    num_slots, out_total, _ = lora_b.shape
    if num_tokens == 0 or out_total == 0:
        return y
    cfg = config or expand_config(num_tokens, out_total, max_rank)
    widths = [b - a for a, b in pairwise(slice_offsets)]
    n_progs = triton.cdiv(triton.cdiv(max(widths), cfg.block_n), cfg.n_iters)
    offs = list(slice_offsets) + [slice_offsets[-1]] * (MAX_SLICES + 1 - len(slice_offsets))
    block_r = min(64, max(16, _next_pow2(max_rank)))
    grid = (triton.cdiv(num_tokens, cfg.block_m) * n_progs, num_slices, num_slots)
    _lora_expand_kernel[grid](
        buf,
        lora_b,
        y,
        batch.sorted_tokens,
        batch.slot_starts,
        batch.slot_counts,
        batch.slot_ranks,
        num_tokens,
        split,
        n_progs,
        cfg.n_iters,
        *offs,
        *buf.stride(),
        *lora_b.stride(),
        *y.stride(),
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_R=block_r,
        DOT_PRECISION=_precision(y.dtype),
        UPCAST=_upcast(y.dtype),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return y
