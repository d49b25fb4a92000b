"""Scores of chosen tokens under rows of logits: log-probability, rank and the top-k alternatives.

Semantics (``row_scores(logits, chosen, k)``, logits [R, V] of any float dtype, read as float32):
``lp = log_softmax(logits.float())``; per row ``lp[chosen]``, the rank of ``chosen`` (1 + the
count of strictly larger logits) and ``torch.topk(lp, k)`` (ties by the smaller token id on the
Triton path, in either order on the torch path). The result is packed for one host copy:
[R, 2 + 2k] float32 = (lp of chosen, rank, k token ids, their lp); ids and ranks below 2**24 are
exact in float32.

On CUDA (or under the interpreter) two Triton launches, whatever ``k``: one program per block of
a row finds the block's max, sum of exponentials, count above the chosen logit and top k; one
program per row combines the blocks. Each logit is read once; ``k`` is a runtime loop and not
specialised on, so one compiled pair serves every k up to MAX_TOP_K (per logits dtype).
Elsewhere torch reductions, run over blocks of a row as well (a decode step has few rows, and
one reduction per long row leaves a GPU idle).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .triton_support import triton_runs_on

__all__ = ["MAX_TOP_K", "row_scores", "top_k_torch"]

MAX_TOP_K = 32  # top-k alternatives a row can ask for (the kernels' candidate tile per block)
MAX_ROW_BLOCKS = 256  # the torch path reduces a row in up to this many blocks
_ROW_BLOCKS = 32  # the Triton path aims at this many blocks a row
_BLOCK_LIMITS = (256, 4096)  # smallest and largest Triton block (elements of a row)


@triton.jit(do_not_specialize=["k"])
def _block_scores_kernel(
    logits_ptr,
    row_stride,
    chosen_ptr,
    vocab,
    k,
    block_max_ptr,
    block_sum_ptr,
    block_count_ptr,
    top_values_ptr,
    top_ids_ptr,
    BLOCK: tl.constexpr,
    K_MAX: tl.constexpr,
):
    row = tl.program_id(0)
    block = tl.program_id(1)
    partial = row * tl.num_programs(1) + block
    cols = block * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    inside = cols < vocab
    base = logits_ptr + row.to(tl.int64) * row_stride
    x = tl.load(base + cols, mask=inside, other=float("-inf")).to(tl.float32)  # [BLOCK]
    picked = tl.load(base + tl.load(chosen_ptr + row)).to(tl.float32)
    high = tl.max(x, axis=0)
    tl.store(block_max_ptr + partial, high)
    # a block of -inf only (columns past a row's own vocabulary) sums to 0, not NaN
    tl.store(block_sum_ptr + partial, tl.sum(tl.exp(x - tl.where(high == float("-inf"), 0.0, high)), axis=0))
    tl.store(block_count_ptr + partial, tl.sum((x > picked).to(tl.float32), axis=0))  # exact below 2**24
    for i in range(k):
        value = tl.max(x, axis=0)
        token = tl.min(tl.where((x == value) & inside, cols, vocab), axis=0)
        tl.store(top_values_ptr + partial * K_MAX + i, value)
        tl.store(top_ids_ptr + partial * K_MAX + i, token)
        x = tl.where(cols == token, float("-inf"), x)


@triton.jit(do_not_specialize=["k", "out_stride"])
def _combine_kernel(
    logits_ptr,
    row_stride,
    chosen_ptr,
    blocks,
    vocab,
    k,
    block_max_ptr,
    block_sum_ptr,
    block_count_ptr,
    top_values_ptr,
    top_ids_ptr,
    out_ptr,
    out_stride,
    BLOCKS_PAD: tl.constexpr,
    K_MAX: tl.constexpr,
):
    row = tl.program_id(0)
    each = tl.arange(0, BLOCKS_PAD)  # [BLOCKS_PAD]
    present = each < blocks
    highs = tl.load(block_max_ptr + row * blocks + each, mask=present, other=float("-inf"))
    sums = tl.load(block_sum_ptr + row * blocks + each, mask=present, other=0.0)
    counts = tl.load(block_count_ptr + row * blocks + each, mask=present, other=0.0)
    high = tl.max(highs, axis=0)
    norm = high + tl.log(tl.sum(sums * tl.exp(highs - high), axis=0))
    picked = tl.load(logits_ptr + row.to(tl.int64) * row_stride + tl.load(chosen_ptr + row)).to(tl.float32)
    out = out_ptr + row * out_stride
    tl.store(out, picked - norm)
    tl.store(out + 1, tl.sum(counts, axis=0) + 1)
    slots = tl.arange(0, BLOCKS_PAD * K_MAX)  # [BLOCKS_PAD * K_MAX]: every block's candidates
    valid = (slots // K_MAX < blocks) & (slots % K_MAX < k)
    where = row * blocks * K_MAX + slots
    values = tl.load(top_values_ptr + where, mask=valid, other=float("-inf"))
    ids = tl.load(top_ids_ptr + where, mask=valid, other=vocab)
    for i in range(k):
        value = tl.max(values, axis=0)
        token = tl.min(tl.where(values == value, ids, vocab), axis=0)
        tl.store(out + 2 + i, token.to(tl.float32))
        tl.store(out + 2 + k + i, value - norm)
        values = tl.where(ids == token, float("-inf"), values)


def row_scores(logits: torch.Tensor, chosen: torch.Tensor, k: int, backend: str = "auto") -> torch.Tensor:
    """[R, 2 + 2k] float32: log-probability and rank of ``chosen`` [R] under ``logits`` [R, V], top ``k``.

    ``backend``: "auto" (Triton on CUDA, torch elsewhere), "triton" or "torch".
    """
    if logits.dim() != 2 or logits.stride(-1) != 1:
        raise ValueError(
            f"logits must be 2-D [rows, vocab] with a contiguous last dim, got {tuple(logits.shape)}"
        )
    if chosen.shape != logits.shape[:1]:
        raise ValueError(f"chosen must be [rows] = [{logits.shape[0]}], got {tuple(chosen.shape)}")
    if not 0 <= k <= min(MAX_TOP_K, logits.shape[1]):
        raise ValueError(f"k must be in 0..{min(MAX_TOP_K, logits.shape[1])}, got {k}")
    if backend not in ("auto", "triton", "torch"):
        raise ValueError(f"backend must be 'auto', 'triton' or 'torch', got {backend!r}")
    if backend == "triton" and not triton_runs_on(logits.device):
        raise ValueError("the triton backend needs CUDA tensors (or TRITON_INTERPRET=1)")
    if backend == "triton" or (backend == "auto" and logits.device.type == "cuda"):
        return _row_scores_triton(logits, chosen, k)
    return _row_scores_torch(logits.float(), chosen, k)


def _row_scores_triton(logits: torch.Tensor, chosen: torch.Tensor, k: int) -> torch.Tensor:
    rows, vocab = logits.shape
    block = min(
        max(triton.next_power_of_2(triton.cdiv(vocab, _ROW_BLOCKS)), _BLOCK_LIMITS[0]), _BLOCK_LIMITS[1]
    )
    blocks = triton.cdiv(vocab, block)
    # one allocation: the result [R, 2 + 2k], then per block its max, sum, count and top values,
    # all float32, and the top ids (int32) after them
    cells = rows * (2 + 2 * k) + rows * blocks * (3 + MAX_TOP_K)
    storage = torch.empty(cells + rows * blocks * MAX_TOP_K, dtype=torch.float32, device=logits.device)
    out = storage[: rows * (2 + 2 * k)].view(rows, 2 + 2 * k)
    if rows == 0:
        return out
    partial = rows * blocks
    start = rows * (2 + 2 * k)
    block_max, block_sum, block_count = storage[start : start + 3 * partial].view(3, partial)
    top_values = storage[start + 3 * partial : cells]  # [R * B * MAX_TOP_K]
    top_ids = storage[cells:].view(torch.int32)  # [R * B * MAX_TOP_K]
    chosen = chosen.contiguous()
    partials = (block_max, block_sum, block_count, top_values, top_ids)
    _block_scores_kernel[(rows, blocks)](
        logits, logits.stride(0), chosen, vocab, k, *partials, BLOCK=block, K_MAX=MAX_TOP_K, num_warps=8
    )
    _combine_kernel[(rows,)](
        logits,
        logits.stride(0),
        chosen,
        blocks,
        vocab,
        k,
        *partials,
        out,
        out.stride(0),
        BLOCKS_PAD=triton.next_power_of_2(blocks),
        K_MAX=MAX_TOP_K,
        num_warps=4,
    )
    return out


def _row_scores_torch(logits: torch.Tensor, chosen: torch.Tensor, k: int) -> torch.Tensor:
    blocks = _blocked(logits)  # [R, B, W]
    norm = torch.logsumexp(torch.logsumexp(blocks, dim=-1), dim=-1, keepdim=True)  # [R, 1]
    picked = logits.gather(1, chosen[:, None])  # [R, 1]
    rank = (blocks > picked[:, :, None]).sum(dim=-1).sum(dim=-1, keepdim=True) + 1  # [R, 1]
    columns = [picked - norm, rank.float()]
    if k > 0:
        values, ids = top_k_torch(logits, k)  # [R, k]
        columns += [ids.float(), values - norm]
    return torch.cat(columns, dim=1)


def _blocked(logits: torch.Tensor) -> torch.Tensor:
    """``logits`` [R, V] viewed as [R, B, V / B] (B the largest power of two <= 256 dividing V; no copy)."""
    rows, vocab = logits.shape
    width = vocab // math.gcd(vocab, MAX_ROW_BLOCKS)
    return logits.view(rows, vocab // width, width)


def top_k_torch(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest values of each row of ``logits`` [R, V] and their ids, largest first ([R, k] each).

    Semantics: ``torch.topk(logits, k, dim=-1)`` (ties in either order); k = 1 is a blocked max.
    """
    if k > 1:
        top = torch.topk(logits, k, dim=-1)
        return top.values, top.indices
    blocks = _blocked(logits)  # [R, B, W]
    block_values, block_ids = blocks.max(dim=-1)  # [R, B]
    values, best = block_values.max(dim=-1, keepdim=True)  # [R, 1]
    return values, best * blocks.shape[-1] + block_ids.gather(1, best)
