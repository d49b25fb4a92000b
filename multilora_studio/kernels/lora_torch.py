"""The LoRA term with torch ops: the CPU engine's path for other dtypes and larger batches.

Tokens are grouped by slot on the host (``.tolist()`` of the batch's buffers, cached on the
batch until its next refill); each adapter's tokens run as a contiguous range (views,
in-place ``addmm_``) or an index list, reading only the rows below the adapter's rank. Decode
steps with several adapters in consecutive slots use the stacked path (``LoRAPlan.stacks``):
every token against every active adapter in a handful of large ops, masked. Rows with slot
-1 are never written. Each token's shrink is multiplied by its strength
(``LoRABatch.token_scales``) only when the batch has some strength other than 1.0
(``LoRABatch.scaled``), so other batches run exactly the ops they ran without strengths.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .lora_batch import LoRABatch
from .lora_plan import LoRAPlan
from .row_tiles import row_tiled

__all__ = ["HostGroups", "add_lora", "expand", "expand_shrunk_in_gemm", "shrink"]


@dataclass(eq=False)
class HostGroups:
    """Host copy of a batch's grouping, made on first use by the torch ops."""

    key: tuple[int, int, int]  # (num_tokens, plan.stacked_max_tokens, plan.stacked_min_adapters)
    # One entry per slot that has tokens and a non-zero rank:
    # (slot, rank, first, last, idx) where idx is None when the tokens are first..last-1.
    groups: list[tuple[int, int, int, int, torch.Tensor | None]]
    max_rank: int  # largest rank among the groups
    # Stacked path (None unless the active slots form one run lo..hi-1 and T is small):
    span: tuple[int, int] | None
    mask: torch.Tensor | None  # [hi - lo, T, 1] bool: token t uses slot lo + g
    valid: torch.Tensor | None  # [n] int64 tokens with an adapter; None when all have one


def _host_groups(batch: LoRABatch, num_tokens: int, plan: LoRAPlan) -> HostGroups:
    """Group tokens by slot on the host (cheap on CPU; syncs on CUDA); cached on the batch."""
    key = (num_tokens, plan.stacked_max_tokens, plan.stacked_min_adapters)
    host = batch.host_grouping
    if isinstance(host, HostGroups) and host.key == key:
        return host
    counts = batch.slot_counts.tolist()
    starts = batch.slot_starts.tolist()
    ranks = batch.slot_ranks.tolist()
    sorted_tokens = batch.sorted_tokens.tolist()
    groups: list[tuple[int, int, int, int, torch.Tensor | None]] = []
    group_tokens: list[list[int]] = []
    for slot, (count, start, rank) in enumerate(zip(counts, starts, ranks, strict=True)):
        if count == 0 or rank <= 0:
            continue
        toks = sorted_tokens[start : start + count]
        if toks[-1] >= num_tokens:  # x has fewer rows than the last update
            toks = [t for t in toks if t < num_tokens]
            if not toks:
                continue
        first, last = toks[0], toks[-1] + 1
        idx = None
        if last - first != len(toks):
            idx = torch.tensor(toks, dtype=torch.int64, device=batch.device)
        groups.append((slot, rank, first, last, idx))
        group_tokens.append(toks)
    span = mask = valid = None
    if plan.stacks(num_tokens, len(groups)) and groups and groups[-1][0] - groups[0][0] == len(groups) - 1:
        span = (groups[0][0], groups[-1][0] + 1)
        mask = torch.zeros(len(groups), num_tokens, 1, dtype=torch.bool)
        for g, toks in enumerate(group_tokens):
            mask[g, toks] = True
        mask = mask.to(batch.device)
        n_valid = sum(len(toks) for toks in group_tokens)
        if n_valid < num_tokens:
            valid = torch.tensor(
                sorted(t for toks in group_tokens for t in toks),
                dtype=torch.int64,
                device=batch.device,
            )
    host = HostGroups(
        key=key,
        groups=groups,
        max_rank=max((g[1] for g in groups), default=0),
        span=span,
        mask=mask,
        valid=valid,
    )
    batch.host_grouping = host
    return host


def _rows(t: torch.Tensor, first: int, last: int, idx: torch.Tensor | None) -> torch.Tensor:
    return t[first:last] if idx is None else t.index_select(0, idx)


def _scaled(
    h: torch.Tensor, batch: LoRABatch, first: int, last: int, idx: torch.Tensor | None
) -> torch.Tensor:
    """``h [S, n, rank]`` times each of its tokens' strength (h itself when the batch has none)."""
    if not batch.scaled:
        return h
    scales = _rows(batch.token_scales, first, last, idx)  # [n] float32
    return h * scales.to(h.dtype)[:, None]


def _group_shrink(xs: torch.Tensor, a_slot: torch.Tensor, rank: int) -> torch.Tensor:
    """``[n, K] x [S, R, K] -> [S, n, rank]`` in xs's dtype, reading rank rows only."""
    num_slices, max_rank, k = a_slot.shape
    if rank == max_rank:
        h = xs @ a_slot.reshape(num_slices * rank, k).T  # [n, S * rank]
        return h.view(-1, num_slices, rank).transpose(0, 1)
    return torch.matmul(xs, a_slot[:, :rank].transpose(1, 2))  # [S, n, rank]


def _group_expand(
    y: torch.Tensor,
    h: torch.Tensor,
    b_slot: torch.Tensor,
    rank: int,
    offs: tuple[int, ...],
    first: int,
    last: int,
    idx: torch.Tensor | None,
) -> None:
    """``y[rows, lo:hi] += h[s] @ b_slot[lo:hi, :rank]^T`` for every slice s.

    Scattered rows go through index_select / index_copy_: index_add_ on a column slice
    of a bfloat16 tensor rewrites every row (through float32) on CPU.
    """
    rows = y[first:last] if idx is None else y.index_select(0, idx)  # [n, out_total]
    for s in range(len(offs) - 1):
        lo, hi = offs[s], offs[s + 1]
        if hi > lo:
            rows[:, lo:hi].addmm_(h[s], b_slot[lo:hi, :rank].T)
    if idx is not None:
        y.index_copy_(0, idx, rows)


def _stacked_add_lora(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    batch: LoRABatch,
    host: HostGroups,
    offs: tuple[int, ...],
) -> None:
    """Decode path: every token against every active slot, masked; 2 + 3S ops in all."""
    assert host.span is not None and host.mask is not None  # narrowing for type checkers
    lo, hi = host.span
    a = lora_a[lo:hi]  # [G, S, R, K]
    g, num_slices, max_rank, k = a.shape
    t = x.shape[0]
    r = host.max_rank
    if r == max_rank:
        h = (x @ a.reshape(g * num_slices * max_rank, k).T).view(t, g, num_slices, r)
        h = h.permute(2, 1, 0, 3)  # [S, G, T, r]
    else:
        h = torch.matmul(x, a[:, :, :r].transpose(2, 3)).transpose(0, 1)  # [S, G, T, r]
    h = torch.where(host.mask, h, 0)  # tokens keep only their own slot's row
    if batch.scaled:
        h = h * batch.token_scales[:t, None].to(h.dtype)  # [S, G, T, r] times [T, 1]
    b = lora_b[lo:hi, :, :r]  # [G, out_total, r]
    valid = host.valid
    rows = y if valid is None else y.index_select(0, valid)  # [n, out_total]
    for s in range(num_slices):
        c0, c1 = offs[s], offs[s + 1]
        if c1 == c0:
            continue
        delta = torch.bmm(h[s], b[:, c0:c1].transpose(1, 2)).sum(0)  # [T, n_s]
        rows[:, c0:c1] += delta if valid is None else delta.index_select(0, valid)
    if valid is not None:
        y.index_copy_(0, valid, rows)


def _tiled_group_add_lora(
    y: torch.Tensor,
    x: torch.Tensor,
    a_slot: torch.Tensor,
    b_slot: torch.Tensor,
    rank: int,
    offs: tuple[int, ...],
    first: int,
    last: int,
    idx: torch.Tensor | None,
    batch: LoRABatch,
    tile: int,
) -> None:
    """One adapter's ``y[rows] += token_scale * (x[rows] A^T) B^T`` with every GEMM in
    ``tile``-row tiles, so a row's result does not depend on how many tokens share its adapter
    (``row_tiles``); a strength of 1.0 multiplies exactly, so strengths elsewhere change nothing."""
    num_slices, _, k = a_slot.shape
    xs = _rows(x, first, last, idx)  # [n, K]
    a = a_slot[:, :rank].reshape(num_slices * rank, k)  # [S * rank, K]
    h = row_tiled(F.linear, tile, xs, a)  # [n, S * rank]
    if batch.scaled:
        h = h * _rows(batch.token_scales, first, last, idx).to(h.dtype)[:, None]
    rows = y[first:last] if idx is None else y.index_select(0, idx)  # [n, out_total]
    for s in range(num_slices):
        lo, hi = offs[s], offs[s + 1]
        if hi > lo:
            rows[:, lo:hi] += row_tiled(F.linear, tile, h[:, s * rank : (s + 1) * rank], b_slot[lo:hi, :rank])
    if idx is not None:
        y.index_copy_(0, idx, rows)


def add_lora(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    batch: LoRABatch,
    offs: tuple[int, ...],
    plan: LoRAPlan,
) -> None:
    """``y += LoRA(x)`` in place: per adapter, or stacked where ``plan.stacks`` says so; in
    row tiles where ``plan.gemm_row_tile`` is set (batch-invariant mode)."""
    host = _host_groups(batch, x.shape[0], plan)
    if plan.gemm_row_tile:
        for slot, rank, first, last, idx in host.groups:
            _tiled_group_add_lora(
                y, x, lora_a[slot], lora_b[slot], rank, offs, first, last, idx, batch, plan.gemm_row_tile
            )
        return
    if host.span is not None:
        _stacked_add_lora(y, x, lora_a, lora_b, batch, host, offs)
        return
    for slot, rank, first, last, idx in host.groups:
        xs = _rows(x, first, last, idx)  # [n, K]
        h = _scaled(_group_shrink(xs, lora_a[slot], rank), batch, first, last, idx)  # [S, n, rank]
        _group_expand(y, h, lora_b[slot], rank, offs, first, last, idx)


def shrink(
    x: torch.Tensor, lora_a: torch.Tensor, batch: LoRABatch, out: torch.Tensor, plan: LoRAPlan
) -> None:
    """Write each token's shrink into the zeroed float32 ``out [S, T, R]``."""
    host = _host_groups(batch, x.shape[0], plan)
    for slot, rank, first, last, idx in host.groups:
        xs = _rows(x, first, last, idx).float()  # [n, K]: buf is float32 math
        h = _group_shrink(xs, lora_a[slot, :, :rank].float(), rank)  # [S, n, rank]
        if idx is None:
            out[:, first:last, :rank] = h
        else:
            out[:, idx, :rank] = h


def expand(
    y: torch.Tensor,
    buf: torch.Tensor,
    lora_b: torch.Tensor,
    batch: LoRABatch,
    offs: tuple[int, ...],
    plan: LoRAPlan,
) -> None:
    """``y += token_scale * buf @ B^T`` per token and slice, in place (buf: float32 ``[S, T, R]``)."""
    host = _host_groups(batch, y.shape[0], plan)
    for slot, rank, first, last, idx in host.groups:
        h = buf[:, first:last, :rank] if idx is None else buf[:, idx, :rank]  # [S, n, rank]
        h = _scaled(h, batch, first, last, idx).to(y.dtype)
        _group_expand(y, h, lora_b[slot], rank, offs, first, last, idx)


def expand_shrunk_in_gemm(
    y: torch.Tensor,
    shrunk: torch.Tensor,
    lora_b: torch.Tensor,
    batch: LoRABatch,
    offs: tuple[int, ...],
    plan: LoRAPlan,
) -> None:
    """The expand of a shrink against every slot (``shrunk [T, slots, S, R]``): each token's
    own slot's row is gathered, then expanded as above."""
    num_tokens = y.shape[0]
    slots = batch.token_slots[:num_tokens].long().clamp(min=0)  # [T]; rows with -1 are never written
    rows = torch.arange(num_tokens, device=y.device)
    buf = shrunk[rows, slots].float().transpose(0, 1)  # [S, T, R]
    expand(y, buf, lora_b, batch, offs, plan)
