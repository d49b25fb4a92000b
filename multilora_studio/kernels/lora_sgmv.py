"""Slot-grouped (SGMV-style) shrink / expand: steps above ``LoRAPlan.bgmv_max_tokens`` tokens.

Model code never imports this module: it calls the wrappers in ``lora``, which check
shapes, dtypes and devices, choose the kernels by the plan and call the launchers here.

Every kernel runs on a fixed grid that depends only on tensor shapes (never on which
slots the tokens use), so one CUDA graph per batch-size bucket replays any adapter mix:

* a program owns one slot and one block of that slot's tokens, read through
  ``LoRABatch.sorted_tokens`` (SGMV-style groups: a prefill request's tokens share a
  tile; in decode each token is its own group, BGMV-style). The blocks of the slots with
  tokens are numbered one after another (``_slot_block``, from the slots' token counts), so
  the grid is the step's token blocks plus one partial block a slot, not slots x token
  blocks: with one adapter in 32 slots, 31 of 32 programs used to exit at once, and their
  scheduling cost a 2,048-token prompt's expands 21 ms on an H200;
* ``tl.dot`` tiles are at least 16 wide; small ranks (4, 8) and short token groups are
  padded inside the kernel by masks, never by padding weights;
* weight tiles (the bytes that matter in decode) are requested before anything that
  waits on the token list, so their latency overlaps the metadata lookups.

Shrink splits ``in_features`` across programs (split-K: decode has few tokens, a large K
and a small rank) and writes one float32 partial per split; expand loads all partials of
its rows in one tile and sums them, then multiplies each row's float32 term by its token's
adapter strength (``LoRABatch.token_scales``; exact for 1.0). No atomics touch data, so
results are bitwise reproducible and graph replay equals eager.

``add_lora`` is one shrink launch then one expand launch. (A single-launch variant, in
which expand programs waited on per-slot counters published by the shrink programs, was
measured slower on an H200: docs/dev/kernels.md.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .lora_batch import LoRABatch
from .lora_bgmv import rank_align
from .lora_slices import padded_offsets, slice_of, slice_programs
from .triton_support import interpreting


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
    num_warps: int = 4
    num_stages: int = 2


# ------------------------------------------------------------------------- tile helpers


@triton.jit
def _shrink_tile(
    x_ptr,
    a_ptr,
    out_ptr,
    sorted_ptr,
    slot,
    split,
    m_block,
    n_block,
    count,
    rank,
    start,
    num_tokens,
    in_features,
    max_rank,
    num_cols,
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
    """partial[split, s, t, r] = x[t, k-chunk] @ a[slot, s, r, k-chunk] for one tile.

    Columns are (slice, rank) pairs, col = s * max_rank + r, so all slices of a fused
    projection share one pass over x. Tiles whose columns all lie beyond the slot's rank
    do nothing.
    """
    cols = n_block * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    sl = cols // max_rank
    r = cols % max_rank
    col_in = cols < num_cols
    col_ok = col_in & (r < rank)
    if tl.max(col_ok.to(tl.int32), axis=0) > 0:
        offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
        m_ok = offs_m < count
        tok = tl.load(sorted_ptr + start + offs_m, mask=m_ok, other=0)
        k_start = split * k_per_split
        offs_k = k_start + tl.arange(0, BLOCK_K)  # [BK]
        a_ptrs = (
            a_ptr
            + slot.to(tl.int64) * stride_al
            + sl[None, :] * stride_as
            + r[None, :] * stride_ar
            + offs_k[:, None] * stride_ak
        )  # [BK, BN]
        m_ok = m_ok & (tok < num_tokens)
        tok = tok.to(tl.int64)
        x_ptrs = x_ptr + tok[:, None] * stride_xt + offs_k[None, :] * stride_xk  # [BM, BK]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, k_per_split, BLOCK_K):
            # A first: its address does not wait for the token list.
            if EVEN_K:
                at = tl.load(a_ptrs, mask=col_ok[None, :], other=0.0)
                xt = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
            else:
                k_ok = offs_k + k < in_features
                at = tl.load(a_ptrs, mask=col_ok[None, :] & k_ok[:, None], other=0.0)
                xt = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
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
def _expand_w(
    b_ptr,
    slot,
    n0,
    hi,
    r0,
    rank,
    stride_wl,
    stride_wn,
    stride_wr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    RANK_ALIGN: tl.constexpr,
):
    """B tile ``[BLOCK_R, BLOCK_N]``: rank rows r0.., output columns n0.. of one slot.

    Rank is B's contiguous dimension: whole RANK_ALIGN-element vectors are loaded (up to the
    rank rounded up) and rows at or beyond the rank are zeroed in registers.
    """
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_r = r0 + tl.arange(0, BLOCK_R)
    ptrs = b_ptr + slot.to(tl.int64) * stride_wl + offs_n[None, :] * stride_wn + offs_r[:, None] * stride_wr
    rank_ld = tl.multiple_of((rank + RANK_ALIGN - 1) // RANK_ALIGN * RANK_ALIGN, RANK_ALIGN)
    w = tl.load(ptrs, mask=(offs_r < rank_ld)[:, None] & (offs_n < hi)[None, :], other=0.0)
    return tl.where((offs_r < rank)[:, None], w, 0.0)


@triton.jit
def _expand_h(
    buf_ptr,
    s,
    tok,
    m_ok,
    r0,
    rank,
    num_splits,
    stride_bp,
    stride_bs,
    stride_bt,
    stride_br,
    SPLIT_BLOCK: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    """Sum of the split-K partials ``[BLOCK_M, BLOCK_R]`` (float32), loaded as one tile."""
    offs_p = tl.arange(0, SPLIT_BLOCK)
    offs_r = r0 + tl.arange(0, BLOCK_R)
    ptrs = (
        buf_ptr
        + s * stride_bs
        + offs_p[:, None, None] * stride_bp
        + tok[None, :, None] * stride_bt
        + offs_r[None, None, :] * stride_br
    )  # [P, BM, BR]
    mask = (offs_p < num_splits)[:, None, None] & m_ok[None, :, None] & (offs_r < rank)[None, None, :]
    # .cg: each partial is read once, by this program; keep it out of L1.
    part = tl.load(ptrs, mask=mask, other=0.0, cache_modifier=".cg")
    return tl.sum(part, axis=0)


@triton.jit
def _expand_tile(
    w0,
    buf_ptr,
    b_ptr,
    y_ptr,
    sorted_ptr,
    scales_ptr,
    slot,
    s,
    m_block,
    n0,
    hi,
    count,
    rank,
    start,
    num_tokens,
    num_splits,
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
    SPLIT_BLOCK: tl.constexpr,
    RANK_ALIGN: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """y[tok, n0:n0+BN] += scale[tok] * h[tok] @ B^T for one tile; ``w0`` is its first B rank block."""
    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    m_ok = offs_m < count
    tok = tl.load(sorted_ptr + start + offs_m, mask=m_ok, other=0)
    m_ok = m_ok & (tok < num_tokens)
    tok = tok.to(tl.int64)
    h = _expand_h(
        buf_ptr, s, tok, m_ok, 0, rank, num_splits,
        stride_bp, stride_bs, stride_bt, stride_br, SPLIT_BLOCK, BLOCK_R,
    )  # fmt: skip
    h = h.to(w0.dtype)
    w = w0
    if UPCAST:
        h = h.to(tl.float32)
        w = w.to(tl.float32)
    acc = tl.dot(h, w, input_precision=DOT_PRECISION)  # [BM, BN]
    for r0 in range(BLOCK_R, rank, BLOCK_R):  # ranks beyond one block (max_rank > 64)
        w = _expand_w(
            b_ptr, slot, n0, hi, r0, rank, stride_wl, stride_wn, stride_wr, BLOCK_N, BLOCK_R, RANK_ALIGN
        )
        h = _expand_h(
            buf_ptr, s, tok, m_ok, r0, rank, num_splits,
            stride_bp, stride_bs, stride_bt, stride_br, SPLIT_BLOCK, BLOCK_R,
        )  # fmt: skip
        h = h.to(w.dtype)
        if UPCAST:
            h = h.to(tl.float32)
            w = w.to(tl.float32)
        acc += tl.dot(h, w, input_precision=DOT_PRECISION)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    y_ptrs = y_ptr + tok[:, None] * stride_yt + offs_n[None, :] * stride_yn  # [BM, BN]
    mask = m_ok[:, None] & (offs_n < hi)[None, :]
    y_old = tl.load(y_ptrs, mask=mask, other=0.0)
    scale = tl.load(scales_ptr + tok, mask=m_ok, other=1.0)  # [BM] the tokens' strengths
    # y += (scale * acc).to(y.dtype); the sum in float32 (exact for scale 1.0), rounded once
    # (as a bf16/fp16 add does).
    delta = (acc * scale[:, None]).to(y_old.dtype).to(tl.float32)
    tl.store(y_ptrs, (y_old.to(tl.float32) + delta).to(y_old.dtype), mask=mask)


@triton.jit
def _slot_block(g, counts_ptr, ranks_ptr, num_slots, BLOCK_M: tl.constexpr, SLOTS: tl.constexpr):
    """``(slot, m_block)`` of the ``g``-th token block of the step: the blocks of each slot with
    tokens and a rank are numbered slot after slot, so the grid covers the step's tokens (plus
    one partial block a slot), not every slot times every token block. ``slot == num_slots``:
    ``g`` is past the last block."""
    offs = tl.arange(0, SLOTS)  # [SLOTS]
    ok = offs < num_slots
    counts = tl.load(counts_ptr + offs, mask=ok, other=0)
    ranks = tl.load(ranks_ptr + offs, mask=ok, other=0)
    blocks = tl.where(ranks > 0, (counts + BLOCK_M - 1) // BLOCK_M, 0)  # [SLOTS]
    ends = tl.cumsum(blocks, axis=0)  # [SLOTS] one past each slot's last block
    slot = tl.sum((ends <= g).to(tl.int32), axis=0)
    first = tl.sum(tl.where(offs == slot, ends - blocks, 0), axis=0)  # the slot's first block
    return slot, g - first


# ------------------------------------------------------------------------------ kernels


# Per-step integers are not specialised (Triton would compile a variant for 1, for multiples
# of 16 and for the rest): a new token count must never compile in the middle of serving.
@triton.jit(do_not_specialize=["num_tokens"])
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
    num_slots,
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
    SLOTS: tl.constexpr,
):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    slot, m_block = _slot_block(pid // n_blocks, counts_ptr, ranks_ptr, num_slots, BLOCK_M, SLOTS)
    n_block = pid % n_blocks
    if slot < num_slots:
        count = tl.load(counts_ptr + slot)
        rank = tl.load(ranks_ptr + slot)
        start = tl.load(starts_ptr + slot)
        _shrink_tile(
            x_ptr, a_ptr, out_ptr, sorted_ptr, slot, split, m_block, n_block, count, rank,
            start, num_tokens, in_features, max_rank, num_cols, k_per_split,
            stride_xt, stride_xk, stride_al, stride_as, stride_ar, stride_ak,
            stride_op, stride_os, stride_ot, stride_or,
            BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, DOT_PRECISION, UPCAST,
        )  # fmt: skip


@triton.jit(do_not_specialize=["num_tokens"])
def _lora_expand_kernel(
    buf_ptr,
    b_ptr,
    y_ptr,
    sorted_ptr,
    scales_ptr,
    starts_ptr,
    counts_ptr,
    ranks_ptr,
    num_tokens,
    num_splits,
    n_progs,
    num_slots,
    c1,
    c2,
    c3,
    off0,
    off1,
    off2,
    off3,
    off4,
    stride_bp,
    stride_bs,
    stride_bt,
    stride_br,
    stride_bl,
    stride_wl,
    stride_wn,
    stride_wr,
    stride_yt,
    stride_yn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr,
    RANK_ALIGN: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    SLOTS: tl.constexpr,
):
    pid = tl.program_id(0)
    slot, m_block = _slot_block(pid // n_progs, counts_ptr, ranks_ptr, num_slots, BLOCK_M, SLOTS)
    n_prog = pid % n_progs
    if slot < num_slots:
        count = tl.load(counts_ptr + slot)
        rank = tl.load(ranks_ptr + slot)
        start = tl.load(starts_ptr + slot)
        s, n0, hi = slice_of(n_prog, c1, c2, c3, off0, off1, off2, off3, off4, BLOCK_N)
        w0 = _expand_w(
            b_ptr, slot, n0, hi, 0, rank, stride_wl, stride_wn, stride_wr, BLOCK_N, BLOCK_R, RANK_ALIGN
        )
        # the slot's own shrink: stride_bl is 0 for the shrink kernel's partials (every token's
        # row holds its own slot's values) and the slot stride of a shrink in GEMM's output
        buf_slot = buf_ptr + slot.to(tl.int64) * stride_bl
        _expand_tile(
            w0, buf_slot, b_ptr, y_ptr, sorted_ptr, scales_ptr, slot, s, m_block, n0, hi, count, rank,
            start, num_tokens, num_splits,
            stride_bp, stride_bs, stride_bt, stride_br, stride_wl, stride_wn, stride_wr,
            stride_yt, stride_yn,
            BLOCK_M, BLOCK_N, BLOCK_R, SPLIT_BLOCK, RANK_ALIGN, DOT_PRECISION, UPCAST,
        )  # fmt: skip


# --------------------------------------------------------------------------- launchers


def token_blocks(num_tokens: int, block_m: int, num_slots: int) -> int:
    """Token blocks a launch's grid covers: every slot's tokens in blocks of ``block_m``, each
    slot's last block partial at worst (a bound from the shapes, so graphs stay valid)."""
    return triton.cdiv(num_tokens, block_m) + min(num_slots, num_tokens)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _prev_pow2(n: int) -> int:
    return 1 << max(0, n.bit_length() - 1)


def _precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


def _upcast(dtype: torch.dtype) -> bool:
    # Triton's interpreter multiplies bfloat16 tiles as their raw uint16 bits; give it
    # float32 tiles holding the same bfloat16 values (exact products, fp32 sums, as on GPU).
    return dtype == torch.bfloat16 and interpreting()


def _block_r(max_rank: int) -> int:
    return min(64, max(16, _next_pow2(max_rank)))


def expand_config(num_tokens: int) -> ExpandConfig:
    """Tile sizes for an expand, from shapes only (so captured graphs stay valid).

    Above 256 tokens: 64 x 128 tiles with 4 warps were the fastest, or within 5 % of it, for
    every Llama-3-8B projection at 2,048 tokens on one adapter and 4,096 on four (H100;
    64 x 256 with 8 warps, the earlier choice, took 1.4-1.6x as long:
    benchmarks/kernels/prefill_lora_bench.py)."""
    if num_tokens <= 64:  # decode: mostly one token per adapter
        return ExpandConfig(block_m=16, block_n=256)
    if num_tokens <= 256:
        return ExpandConfig(block_m=32, block_n=256)
    return ExpandConfig(block_m=64, block_n=128)


# Largest partial tile (splits x token rows x rank columns, float32) one expand program
# loads at once: bounds its registers and shared memory.
_PARTIAL_TILE = 4096


def shrink_config(num_tokens: int, in_features: int, num_slices: int, max_rank: int) -> ShrinkConfig:
    """Tile sizes for a shrink, from shapes only (so captured graphs stay valid)."""
    block_m = 16 if num_tokens <= 16 else 32 if num_tokens <= 128 else 64
    block_n = min(64, max(16, _next_pow2(num_slices * max_rank)))
    block_k = 128 if block_m <= 32 else 64
    # Split K so that each program reads about 512 columns of A (decode: few tokens,
    # large K, small rank), within what one expand program sums in one tile. Four splits at
    # 4,096 tokens beat two by 10-25 % on the H100 (prefill_lora_bench).
    rows = expand_config(num_tokens).block_m * _block_r(max_rank)
    split_k = min(
        32,
        _prev_pow2(max(1, in_features // 512)),
        _prev_pow2(max(1, 16384 // num_tokens)),
        _prev_pow2(max(1, _PARTIAL_TILE // rows)),
    )
    return ShrinkConfig(block_m, block_n, block_k, split_k)


def _split_layout(in_features: int, cfg: ShrinkConfig) -> tuple[int, int]:
    """(k_per_split, number of splits) with k_per_split a multiple of block_k."""
    k_per_split = triton.cdiv(triton.cdiv(in_features, cfg.split_k), cfg.block_k) * cfg.block_k
    return k_per_split, triton.cdiv(in_features, k_per_split)


def shrink_partials(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    batch: LoRABatch,
    out: torch.Tensor | None = None,
    config: ShrinkConfig | None = None,
) -> torch.Tensor:
    """Launch the shrink kernel; returns float32 partials ``[splits, S, T, R]``.

    ``out`` (when given, the config must have split_k == 1) is ``[S, T, R]``, filled directly.
    """
    num_tokens, in_features = x.shape
    _, num_slices, max_rank, _ = lora_a.shape
    num_cols = num_slices * max_rank
    cfg = config or shrink_config(num_tokens, in_features, num_slices, max_rank)
    k_per_split, splits = _split_layout(in_features, cfg)
    if out is None:
        part = torch.empty((splits, num_slices, num_tokens, max_rank), dtype=torch.float32, device=x.device)
    else:
        if splits != 1:
            raise ValueError("shrink into out= needs a configuration without split-K")
        part = out.unsqueeze(0)
    if num_tokens == 0:
        return part
    n_blocks = triton.cdiv(num_cols, cfg.block_n)
    grid = (token_blocks(num_tokens, cfg.block_m, batch.num_slots) * n_blocks, splits)
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
        batch.num_slots,
        *x.stride(),
        *lora_a.stride(),
        *part.stride(),
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        EVEN_K=in_features % k_per_split == 0,
        DOT_PRECISION=_precision(x.dtype),
        UPCAST=_upcast(x.dtype),
        SLOTS=_next_pow2(batch.num_slots),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return part


def shrink(x: torch.Tensor, lora_a: torch.Tensor, batch: LoRABatch, out: torch.Tensor) -> torch.Tensor:
    """Shrink into ``out [S, T, R]``; split-K partials are summed by one torch op."""
    num_tokens, in_features = x.shape
    cfg = shrink_config(num_tokens, in_features, lora_a.shape[1], lora_a.shape[2])
    if _split_layout(in_features, cfg)[1] == 1:
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
    """Launch the expand kernel: ``buf`` is float32 partials ``[splits, S, T, R]``."""
    splits, _, num_tokens, max_rank = buf.shape
    strides = (*buf.stride(), 0)  # (split, slice, token, rank, slot): each token's own row
    return _launch_expand(y, buf, strides, splits, num_tokens, max_rank, lora_b, batch, slice_offsets, config)


def expand_shrunk_in_gemm(
    y: torch.Tensor,
    shrunk: torch.Tensor,
    lora_b: torch.Tensor,
    batch: LoRABatch,
    slice_offsets: tuple[int, ...],
    config: ExpandConfig | None = None,
) -> torch.Tensor:
    """Slot-grouped expand whose input is the shrink against the leading slots (the shrink in
    GEMM): ``shrunk [T, span, S, R]`` (any strides, any float dtype), ``x[t] @ A[l, s]^T`` for
    every slot ``l < span``; each program reads its slot's values of its tokens."""
    num_tokens, _, _, max_rank = shrunk.shape
    st_t, st_l, st_s, st_r = shrunk.stride()
    strides = (0, st_s, st_t, st_r, st_l)  # (split, slice, token, rank, slot): one split
    return _launch_expand(y, shrunk, strides, 1, num_tokens, max_rank, lora_b, batch, slice_offsets, config)


def _launch_expand(
    y: torch.Tensor,
    buf: torch.Tensor,
    buf_strides: tuple[int, ...],
    splits: int,
    num_tokens: int,
    max_rank: int,
    lora_b: torch.Tensor,
    batch: LoRABatch,
    slice_offsets: tuple[int, ...],
    config: ExpandConfig | None,
) -> torch.Tensor:
    _, out_total, _ = lora_b.shape
    if num_tokens == 0 or out_total == 0:
        return y
    cfg = config or expand_config(num_tokens)
    cum, n_progs = slice_programs(slice_offsets, cfg.block_n)
    grid = (token_blocks(num_tokens, cfg.block_m, batch.num_slots) * n_progs,)
    _lora_expand_kernel[grid](
        buf,
        lora_b,
        y,
        batch.sorted_tokens,
        batch.token_scales,
        batch.slot_starts,
        batch.slot_counts,
        batch.slot_ranks,
        num_tokens,
        splits,
        n_progs,
        batch.num_slots,
        *cum,
        *padded_offsets(slice_offsets),
        *buf_strides,
        *lora_b.stride(),
        *y.stride(),
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_R=_block_r(max_rank),
        SPLIT_BLOCK=_next_pow2(splits),
        RANK_ALIGN=rank_align(lora_b),
        DOT_PRECISION=_precision(y.dtype),
        UPCAST=_upcast(y.dtype),
        SLOTS=_next_pow2(batch.num_slots),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return y
