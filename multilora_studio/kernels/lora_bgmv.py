"""Token-major (BGMV-style) shrink / expand: the decode path (up to ``LoRAPlan.bgmv_max_tokens`` tokens).

In a decode step each request contributes one token, and with many adapters nearly every
token has its own. These kernels give every program one token and read that token's slot
and rank directly (``LoRABatch.token_slots`` / ``token_ranks``): no sorted token list, no
per-slot counts, one dependent load before the weight tiles are requested. Tokens of the
same adapter re-read its tiles, which then come from L2.

* shrink: program ``(t, s * splits + split)`` computes ``x[t, k-chunk] @ A[slot, s]^T`` for
  one ``BLOCK_K`` chunk of ``in_features`` (one tile, no loop over K) and stores a float32
  partial ``[splits, S, T, R]`` (the layout the expand kernels of ``lora_sgmv`` read too);
* expand: program ``(t, n)`` loads a ``[BLOCK_N, BLOCK_R]`` tile of its slot's B, sums the
  token's partials, and adds ``scale * h @ B^T`` (float32 products and sum, times the token's
  strength ``LoRABatch.token_scales[t]``, rounded once) into ``y[t, n-block]``.

Products are formed in float32 from the stored values (no tensor-core rounding of ``h`` to
the weight dtype), ranks above ``BLOCK_R`` loop over rank blocks up to the slot's rank, and
rows ``r >= rank`` are never read.

Programmatic dependent launch (``LoRAPlan.pdl``; Hopper and newer, Triton with ``gdc_wait``): weight tiles
and metadata are requested before ``gdc_wait``; activations, partials and ``y`` are read,
and anything is written, only after it. A kernel launched this way can start while the
previous kernel in the stream finishes, which hides launch latency and the weight-load
latency. Metadata read before the wait must not be written by the immediately preceding
kernel (``LoRABatch.update`` writes ``num_tokens`` last, which these kernels do not read).
Dependents are released only after a kernel's own wait, so the overlap never reaches
further back than one kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .lora_batch import LoRABatch
from .lora_plan import LoRAPlan
from .lora_slices import padded_offsets, slice_of, slice_programs
from .triton_support import gdc_launch_dependents, gdc_wait, launch_options


def block_r(max_rank: int) -> int:
    """Rank rows per tile: max_rank rounded up to a power of two, within 8..64."""
    return min(64, max(8, triton.next_power_of_2(max_rank)))


def rank_align(lora_b: torch.Tensor) -> int:
    """Columns of B read as one vector along the rank: 8 when the storage allows it
    (rank contiguous, max_rank a multiple of 8), else 1 (exact masks)."""
    max_rank = lora_b.shape[2]
    return 8 if lora_b.stride(2) == 1 and max_rank % 8 == 0 else 1


def shrink_block_k(max_rank: int, in_features: int, tile: int) -> int:
    """K columns per shrink program: a rank-block x BLOCK_K tile of about ``tile`` elements."""
    return min(tile // block_r(max_rank), max(16, triton.next_power_of_2(in_features)))


def expand_block_n(max_rank: int, tile: int) -> int:
    """Output columns per expand program: a BLOCK_N x rank-block tile of ``tile`` elements."""
    return max(16, tile // block_r(max_rank))


@triton.jit
def _bgmv_shrink_kernel(
    x_ptr,
    a_ptr,
    part_ptr,
    slots_ptr,
    ranks_ptr,
    in_features,
    num_splits,
    stride_xt,
    stride_xk,
    stride_al,
    stride_as,
    stride_ar,
    stride_ak,
    stride_pp,
    stride_ps,
    stride_pt,
    stride_pr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """part[split, s, t, r] = sum_k x[t, k] * A[slot[t], s, r, k] over one K chunk."""
    t = tl.program_id(0)
    pid = tl.program_id(1)
    s = pid // num_splits
    split = pid % num_splits
    slot = tl.load(slots_ptr + t)
    rank = tl.load(ranks_ptr + t)
    offs_r = tl.arange(0, BLOCK_R)  # [BR]
    offs_k = split * BLOCK_K + tl.arange(0, BLOCK_K)  # [BK]
    k_ok = offs_k < in_features
    a_ptrs = (
        a_ptr
        + slot.to(tl.int64) * stride_al
        + s * stride_as
        + offs_r[:, None] * stride_ar
        + offs_k[None, :] * stride_ak
    )  # [BR, BK]
    # token_ranks is 0 for tokens without an adapter: every mask below is then empty.
    active = rank > 0
    a_mask = (offs_r < rank)[:, None] if EVEN_K else (offs_r < rank)[:, None] & k_ok[None, :]
    a = tl.load(a_ptrs, mask=a_mask, other=0.0)  # weights first: they do not wait on x
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    if active:
        xk = tl.load(x_ptr + t.to(tl.int64) * stride_xt + offs_k * stride_xk, mask=k_ok, other=0.0)
        xk = xk.to(tl.float32)  # [BK]
        p_ptrs = part_ptr + split * stride_pp + s * stride_ps + t.to(tl.int64) * stride_pt
        acc = tl.sum(a.to(tl.float32) * xk[None, :], axis=1)  # [BR]
        tl.store(p_ptrs + offs_r * stride_pr, acc, mask=offs_r < rank)
        for r0 in range(BLOCK_R, rank, BLOCK_R):  # ranks above one block
            rows = r0 + offs_r
            a = tl.load(
                a_ptrs + r0 * stride_ar, mask=(rows < rank)[:, None] & k_ok[None, :], other=0.0
            )  # [BR, BK]
            acc = tl.sum(a.to(tl.float32) * xk[None, :], axis=1)  # [BR]
            tl.store(p_ptrs + rows * stride_pr, acc, mask=rows < rank)


@triton.jit
def _sum_partials(p_ptrs, rows, rank, num_splits, stride_pp, SPLIT_BLOCK: tl.constexpr):
    """Sum over splits of one token's partials for rank rows ``rows`` -> [BR] float32."""
    offs_p = tl.arange(0, SPLIT_BLOCK)
    ptrs = p_ptrs + offs_p[:, None] * stride_pp  # [P, BR]
    mask = (offs_p < num_splits)[:, None] & (rows < rank)[None, :]
    part = tl.load(ptrs, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)  # [P, BR]
    return tl.sum(part, axis=0)


@triton.jit
def _bgmv_expand_kernel(
    part_ptr,
    b_ptr,
    y_ptr,
    slots_ptr,
    ranks_ptr,
    scales_ptr,
    num_splits,
    c1,
    c2,
    c3,
    off0,
    off1,
    off2,
    off3,
    off4,
    stride_pp,
    stride_ps,
    stride_pt,
    stride_pr,
    stride_pl,
    stride_wl,
    stride_wn,
    stride_wr,
    stride_yt,
    stride_yn,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr,
    RANK_ALIGN: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """y[t, n-block] += scale[t] * sum_r h[t, r] * B[slot[t], n, r], h = sum of the partials.

    The token's partials start at ``part + s * stride_ps + t * stride_pt + slot * stride_pl``:
    ``stride_pl`` is 0 for per-token partials and the slot stride for a shrink computed
    against every slot (``expand_shrunk_in_gemm``).
    """
    t = tl.program_id(0)
    n_prog = tl.program_id(1)
    slot = tl.load(slots_ptr + t)
    rank = tl.load(ranks_ptr + t)
    scale = tl.load(scales_ptr + t)  # the token's adapter strength, float32
    s, n0, hi = slice_of(n_prog, c1, c2, c3, off0, off1, off2, off3, off4, BLOCK_N)
    offs_n = n0 + tl.arange(0, BLOCK_N)  # [BN]
    offs_r = tl.arange(0, BLOCK_R)  # [BR]
    n_ok = offs_n < hi
    active = rank > 0  # token_ranks is 0 for tokens without an adapter
    w_ptrs = b_ptr + slot.to(tl.int64) * stride_wl + offs_n[:, None] * stride_wn + offs_r[None, :] * stride_wr
    # Rank is B's contiguous dimension: load whole RANK_ALIGN-element vectors (up to the
    # rank rounded up; storage holds at least that many columns) and zero the columns at
    # or beyond the rank in registers, so padding never reaches the sum.
    rank_ld = tl.multiple_of((rank + RANK_ALIGN - 1) // RANK_ALIGN * RANK_ALIGN, RANK_ALIGN)
    w = tl.load(w_ptrs, mask=n_ok[:, None] & (offs_r < rank_ld)[None, :], other=0.0)  # [BN, BR]
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    if active:
        # Activations now, all at once: y and the token's partials.
        y_ptrs = y_ptr + t.to(tl.int64) * stride_yt + offs_n * stride_yn  # [BN]
        y_old = tl.load(y_ptrs, mask=n_ok, other=0.0)
        p_ptrs = (
            part_ptr
            + s * stride_ps
            + t.to(tl.int64) * stride_pt
            + slot.to(tl.int64) * stride_pl
            + offs_r[None, :] * stride_pr
        )  # [1, BR]
        h = _sum_partials(p_ptrs, offs_r, rank, num_splits, stride_pp, SPLIT_BLOCK)  # [BR]
        w = tl.where((offs_r < rank)[None, :], w, 0.0)
        acc = tl.sum(w.to(tl.float32) * h[None, :], axis=1)  # [BN]
        for r0 in range(BLOCK_R, rank, BLOCK_R):  # ranks above one block
            rows = r0 + offs_r
            w = tl.load(
                w_ptrs + r0 * stride_wr, mask=n_ok[:, None] & (rows < rank_ld)[None, :], other=0.0
            )  # [BN, BR]
            w = tl.where((rows < rank)[None, :], w, 0.0)
            h = _sum_partials(p_ptrs + r0 * stride_pr, rows, rank, num_splits, stride_pp, SPLIT_BLOCK)
            acc += tl.sum(w.to(tl.float32) * h[None, :], axis=1)
        # y += (scale * acc).to(y.dtype): the sum in float32 (exact for scale 1.0), rounded once.
        delta = (acc * scale).to(y_old.dtype).to(tl.float32)
        tl.store(y_ptrs, (y_old.to(tl.float32) + delta).to(y_old.dtype), mask=n_ok)


# ------------------------------------------- helpers of the kernels that fold an expand in


@triton.jit
def load_token_b(
    b_ptr, slot, rank, offs_n, n_ok, offs_r, stride_wl, stride_wn, stride_wr, RANK_ALIGN: tl.constexpr
):
    """``[BN, BR]`` tile of the token's B, rows ``offs_n``: whole RANK_ALIGN-element vectors up
    to the rank rounded up (the storage holds them), zeros elsewhere."""
    rank_ld = tl.multiple_of((rank + RANK_ALIGN - 1) // RANK_ALIGN * RANK_ALIGN, RANK_ALIGN)
    ptrs = b_ptr + slot.to(tl.int64) * stride_wl + offs_n[:, None] * stride_wn + offs_r[None, :] * stride_wr
    return tl.load(ptrs, mask=n_ok[:, None] & (offs_r < rank_ld)[None, :], other=0.0)


@triton.jit
def add_token_lora(y, w, h_ptrs, rank, offs_r, scale):
    """``y + scale * h @ w^T`` for one token (h: its ``rank`` shrink values at ``h_ptrs``, scale its
    float32 strength), rounded as the expand rounds y: the term to y's dtype, then the sum once.
    Rank padding never reaches it."""
    in_rank = offs_r < rank
    h = tl.load(h_ptrs, mask=in_rank, other=0.0).to(tl.float32)  # [BR]
    w = tl.where(in_rank[None, :], w, 0.0)  # [BN, BR]
    delta = tl.sum(w.to(tl.float32) * h[None, :], axis=1) * scale  # [BN]
    return (y.to(tl.float32) + delta.to(y.dtype).to(tl.float32)).to(y.dtype)


# --------------------------------------------------------------------------- launchers


def shrink_partials(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    batch: LoRABatch,
    plan: LoRAPlan,
    block_k: int | None = None,
) -> torch.Tensor:
    """Launch the token-major shrink; returns float32 partials ``[splits, S, T, R]``.

    Tiles and launch options from ``plan`` (``block_k`` overrides the tile's K columns).
    """
    num_tokens, in_features = x.shape
    _, num_slices, max_rank, _ = lora_a.shape
    bk = block_k or shrink_block_k(max_rank, in_features, plan.bgmv_shrink_tile)
    br = block_r(max_rank)
    splits = triton.cdiv(in_features, bk)
    part = torch.empty((splits, num_slices, num_tokens, max_rank), dtype=torch.float32, device=x.device)
    if num_tokens == 0:
        return part
    _bgmv_shrink_kernel[(num_tokens, num_slices * splits)](
        x,
        lora_a,
        part,
        batch.token_slots,
        batch.token_ranks,
        in_features,
        splits,
        *x.stride(),
        *lora_a.stride(),
        *part.stride(),
        BLOCK_R=br,
        BLOCK_K=bk,
        EVEN_K=in_features % bk == 0,
        **launch_options(plan.pdl, plan.bgmv_shrink_warps),
    )
    return part


def expand(
    y: torch.Tensor,
    part: torch.Tensor,
    lora_b: torch.Tensor,
    batch: LoRABatch,
    slice_offsets: tuple[int, ...],
    plan: LoRAPlan,
    block_n: int | None = None,
) -> torch.Tensor:
    """Launch the token-major expand: ``part`` is float32 partials ``[splits, S, T, R]``.

    Tiles and launch options from ``plan`` (``block_n`` overrides the tile's output columns).
    """
    splits, _, num_tokens, max_rank = part.shape
    strides = (*part.stride(), 0)  # (split, slice, token, rank, slot): per-token partials
    return _launch_expand(
        y, part, strides, splits, num_tokens, max_rank, lora_b, batch, slice_offsets, plan, block_n
    )


def expand_shrunk_in_gemm(
    y: torch.Tensor,
    shrunk: torch.Tensor,
    lora_b: torch.Tensor,
    batch: LoRABatch,
    slice_offsets: tuple[int, ...],
    plan: LoRAPlan,
) -> torch.Tensor:
    """Token-major expand whose input is the shrink against EVERY slot (the shrink in GEMM).

    ``shrunk`` is ``[T, num_slots, S, R]`` (any strides, any float dtype): ``x[t] @ A[l, s]^T``
    for every slot ``l``, as one GEMM against the slots' A rows appended to the base weight
    produces it. Each token reads its own slot's row: ``y[t] += shrunk[t, slot[t], s] @ B[slot[t]]^T``.
    """
    num_tokens, _, _, max_rank = shrunk.shape
    st_t, st_l, st_s, st_r = shrunk.stride()
    strides = (0, st_s, st_t, st_r, st_l)  # (split, slice, token, rank, slot): one split
    return _launch_expand(
        y, shrunk, strides, 1, num_tokens, max_rank, lora_b, batch, slice_offsets, plan, None
    )


def _launch_expand(
    y: torch.Tensor,
    part: torch.Tensor,
    part_strides: tuple[int, ...],
    splits: int,
    num_tokens: int,
    max_rank: int,
    lora_b: torch.Tensor,
    batch: LoRABatch,
    slice_offsets: tuple[int, ...],
    plan: LoRAPlan,
    block_n: int | None,
) -> torch.Tensor:
    out_total = lora_b.shape[1]
    if num_tokens == 0 or out_total == 0:
        return y
    bn = block_n or expand_block_n(max_rank, plan.bgmv_expand_tile)
    cum, n_progs = slice_programs(slice_offsets, bn)
    _bgmv_expand_kernel[(num_tokens, n_progs)](
        part,
        lora_b,
        y,
        batch.token_slots,
        batch.token_ranks,
        batch.token_scales,
        splits,
        *cum,
        *padded_offsets(slice_offsets),
        *part_strides,
        *lora_b.stride(),
        *y.stride(),
        BLOCK_N=bn,
        BLOCK_R=block_r(max_rank),
        SPLIT_BLOCK=triton.next_power_of_2(splits),
        RANK_ALIGN=rank_align(lora_b),
        **launch_options(plan.pdl, plan.bgmv_expand_warps),
    )
    return y
