"""Token-major (BGMV-style) shrink / expand for small batches: the decode path.

In a decode step each request contributes one token, and with many adapters nearly every
token has its own. These kernels give every program one token and read that token's slot
and rank directly (``LoRABatch.token_slots`` / ``token_ranks``): no sorted token list, no
per-slot counts, one dependent load before the weight tiles are requested. Tokens of the
same adapter re-read its tiles, which then come from L2.

* shrink: program ``(t, s * splits + split)`` computes ``x[t, k-chunk] @ A[slot, s]^T`` for
  one ``BLOCK_K`` chunk of ``in_features`` (one tile, no loop over K) and stores a float32
  partial ``[splits, S, T, R]`` (the layout the expand kernels of ``lora_triton`` read);
* expand: program ``(t, n)`` loads a ``[BLOCK_N, BLOCK_R]`` tile of its slot's B, sums the
  token's partials, and adds ``h @ B^T`` (float32 products and sum, rounded once) into
  ``y[t, n-block]``.

Products are formed in float32 from the stored values (no tensor-core rounding of ``h`` to
the weight dtype), ranks above ``BLOCK_R`` loop over rank blocks up to the slot's rank, and
rows ``r >= rank`` are never read.

Programmatic dependent launch (Hopper and newer, Triton with ``gdc_wait``): weight tiles
and metadata are requested before ``gdc_wait``; activations, partials and ``y`` are read,
and anything is written, only after it. A kernel launched this way can start while the
previous kernel in the stream finishes, which hides launch latency and the weight-load
latency. Metadata read before the wait must not be written by the immediately preceding
kernel (``LoRABatch.update`` writes ``num_tokens`` last, which these kernels do not read).
Dependents are released only after a kernel's own wait, so the overlap never reaches
further back than one kernel.
"""

from __future__ import annotations

import os
from functools import cache

import torch
import triton
import triton.language as tl

from .lora import LoRABatch, _interpreting
from .lora_slices import padded_offsets, slice_of, slice_programs

try:  # Triton >= 3.4 (programmatic dependent launch); no-op fallbacks otherwise
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    _HAVE_GDC = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    _HAVE_GDC = False

    @triton.jit
    def gdc_wait():  # type: ignore[no-redef,unused-ignore]
        pass

    @triton.jit
    def gdc_launch_dependents():  # type: ignore[no-redef,unused-ignore]
        pass


# Tokens up to which add_lora uses these kernels; above it the slot-grouped (SGMV) kernels
# of lora_triton, which read each adapter's tiles once per token block. On the H200 the
# token-major kernels were 1.8-2.5x faster with 8-256 distinct adapters and as fast or
# faster with all tokens on one adapter, up to 256 tokens (docs/kernels.md).
DECODE_MAX_TOKENS = 256
# Tile sizes in elements (rank rows x K columns for shrink, output columns x rank rows for
# expand); the rank block is max_rank rounded up to a power of two, 8..64, and larger
# ranks loop over rank blocks up to each slot's rank. Chosen by the tile sweeps of
# kernels/bench.py and kernels/step_lora_bench.py on the H200 (decode, batch 32, 32 distinct
# rank-16 adapters): 8192-element expand tiles tie with 16384 after the kernel shrink and
# beat them after the shrink inside the GEMM (0.998 vs 1.082 ms a 32-layer step).
SHRINK_TILE = 16384
SHRINK_WARPS = 4
EXPAND_TILE = 8192
EXPAND_WARPS = 4


def block_r(max_rank: int) -> int:
    """Rank rows per tile: max_rank rounded up to a power of two, within 8..64."""
    return min(64, max(8, triton.next_power_of_2(max_rank)))


@cache
def _pdl_capable(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def use_pdl(device: torch.device) -> bool:
    """Whether to launch with programmatic dependent launch on ``device``.

    Needs CUDA compute capability 9.0+, a Triton that has ``gdc_wait``, not the
    interpreter, and ``MULTILORA_PDL`` not set to ``0``.
    """
    if device.type != "cuda" or not _HAVE_GDC or _interpreting():
        return False
    if os.environ.get("MULTILORA_PDL", "1") == "0":
        return False
    return _pdl_capable(device.index if device.index is not None else torch.cuda.current_device())


def _launch_options(pdl: bool, num_warps: int) -> dict[str, object]:
    opts: dict[str, object] = {"num_warps": num_warps, "USE_PDL": pdl}
    if pdl:
        opts["launch_pdl"] = True
    return opts


def rank_align(lora_b: torch.Tensor) -> int:
    """Columns of B read as one vector along the rank: 8 when the storage allows it
    (rank contiguous, max_rank a multiple of 8), else 1 (exact masks)."""
    max_rank = lora_b.shape[2]
    return 8 if lora_b.stride(2) == 1 and max_rank % 8 == 0 else 1


def shrink_block_k(max_rank: int, in_features: int) -> int:
    """K columns per shrink program: a rank-block x BLOCK_K tile of about SHRINK_TILE elements."""
    return min(SHRINK_TILE // block_r(max_rank), max(16, triton.next_power_of_2(in_features)))


def expand_block_n(max_rank: int) -> int:
    """Output columns per expand program: a BLOCK_N x rank-block tile of EXPAND_TILE elements."""
    return max(16, EXPAND_TILE // block_r(max_rank))


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
    """y[t, n-block] += sum_r h[t, r] * B[slot[t], n, r], h = sum of the partials.

    The token's partials start at ``part + s * stride_ps + t * stride_pt + slot * stride_pl``:
    ``stride_pl`` is 0 for per-token partials and the slot stride for a shrink computed
    against every slot (``expand_gathered``).
    """
    t = tl.program_id(0)
    n_prog = tl.program_id(1)
    slot = tl.load(slots_ptr + t)
    rank = tl.load(ranks_ptr + t)
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
        # y += delta.to(y.dtype): the sum in float32, rounded once.
        delta = acc.to(y_old.dtype).to(tl.float32)
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
def add_token_lora(y, w, h_ptrs, rank, offs_r):
    """``y + h @ w^T`` for one token (h: its ``rank`` shrink values at ``h_ptrs``), rounded as the
    expand rounds y: the term to y's dtype, then the sum once. Rank padding never reaches it."""
    in_rank = offs_r < rank
    h = tl.load(h_ptrs, mask=in_rank, other=0.0).to(tl.float32)  # [BR]
    w = tl.where(in_rank[None, :], w, 0.0)  # [BN, BR]
    delta = tl.sum(w.to(tl.float32) * h[None, :], axis=1)  # [BN]
    return (y.to(tl.float32) + delta.to(y.dtype).to(tl.float32)).to(y.dtype)


# Ranks up to which the kernels that fold an expand in cover the whole rank in one tile
# (larger ranks take the separate expand).
MAX_FUSED_RANK = 64


def folds_expand(backend_kind: str, num_tokens: int, max_rank: int) -> bool:
    """Whether an expand can be folded into the kernel that reads its output this call."""
    return backend_kind == "triton" and num_tokens <= DECODE_MAX_TOKENS and max_rank <= MAX_FUSED_RANK


def check_gathered(
    num_tokens: int,
    out_total: int,
    dtype: torch.dtype,
    shrunk: torch.Tensor,
    lora_b: torch.Tensor,
    slices: int,
) -> None:
    """ValueError unless ``shrunk`` is ``[T, slots, slices, R]`` and ``lora_b`` is
    ``[slots, out_total, R]`` in ``dtype``."""
    if shrunk.dim() != 4 or shrunk.shape[0] != num_tokens or shrunk.shape[2] != slices:
        raise ValueError(
            f"shrunk must be [{num_tokens}, num_slots, {slices}, max_rank], got {tuple(shrunk.shape)}"
        )
    if tuple(lora_b.shape) != (shrunk.shape[1], out_total, shrunk.shape[3]) or lora_b.dtype != dtype:
        raise ValueError(
            f"lora_b must be [{shrunk.shape[1]}, {out_total}, {shrunk.shape[3]}] in {dtype}, "
            f"got {tuple(lora_b.shape)} {lora_b.dtype}"
        )


# --------------------------------------------------------------------------- launchers


def shrink_partials(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    batch: LoRABatch,
    block_k: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Launch the token-major shrink; returns float32 partials ``[splits, S, T, R]``."""
    num_tokens, in_features = x.shape
    _, num_slices, max_rank, _ = lora_a.shape
    bk = block_k or shrink_block_k(max_rank, in_features)
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
        **_launch_options(use_pdl(x.device), num_warps or SHRINK_WARPS),
    )
    return part


def expand(
    y: torch.Tensor,
    part: torch.Tensor,
    lora_b: torch.Tensor,
    batch: LoRABatch,
    slice_offsets: tuple[int, ...],
    block_n: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Launch the token-major expand: ``part`` is float32 partials ``[splits, S, T, R]``."""
    splits, _, num_tokens, max_rank = part.shape
    strides = (*part.stride(), 0)  # (split, slice, token, rank, slot): per-token partials
    return _launch_expand(
        y, part, strides, splits, num_tokens, max_rank, lora_b, batch, slice_offsets, block_n, num_warps
    )


def expand_gathered(
    y: torch.Tensor,
    shrunk: torch.Tensor,
    lora_b: torch.Tensor,
    batch: LoRABatch,
    slice_offsets: tuple[int, ...],
    block_n: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Token-major expand whose input is the shrink against EVERY slot.

    ``shrunk`` is ``[T, num_slots, S, R]`` (any strides, any float dtype): ``x[t] @ A[l, s]^T``
    for every slot ``l``, as one GEMM against the slots' A rows appended to the base weight
    produces it. Each token reads its own slot's row: ``y[t] += shrunk[t, slot[t], s] @ B[slot[t]]^T``.
    """
    num_tokens, _, _, max_rank = shrunk.shape
    st_t, st_l, st_s, st_r = shrunk.stride()
    strides = (0, st_s, st_t, st_r, st_l)  # (split, slice, token, rank, slot): one split
    return _launch_expand(
        y, shrunk, strides, 1, num_tokens, max_rank, lora_b, batch, slice_offsets, block_n, num_warps
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
    block_n: int | None,
    num_warps: int | None,
) -> torch.Tensor:
    out_total = lora_b.shape[1]
    if num_tokens == 0 or out_total == 0:
        return y
    bn = block_n or expand_block_n(max_rank)
    cum, n_progs = slice_programs(slice_offsets, bn)
    _bgmv_expand_kernel[(num_tokens, n_progs)](
        part,
        lora_b,
        y,
        batch.token_slots,
        batch.token_ranks,
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
        **_launch_options(use_pdl(y.device), num_warps or EXPAND_WARPS),
    )
    return y
