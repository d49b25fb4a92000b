"""Decode attention over the paged KV cache for float32 on the CPU, compiled by Numba.

The torch path gathers every sequence's blocks into a padded copy and runs one masked SDPA
per layer (about 260 us a layer at 8 sequences of 160 tokens on two cores, mostly copies
and operation overhead). This kernel reads the keys and values in place through the block
table: for each sequence and KV head, the scores of its query heads (the GQA group) against
each position, a max-subtracted softmax, and the weighted sum of values, all in float32.
Single-threaded, without the GIL. Prefill sequences keep the torch path.

``invariant_attention`` is the batch-invariant mode's attention (``LoRAPlan.batch_invariant``):
one kernel for every query row of a step, decode or prefill, reading every key from the cache
(which already holds the step's own keys), in float32. A query's scores, softmax and weighted
sum run over positions 0..its own in loops that depend only on its own length and the shapes,
so its result is the same bits whatever else is in the step and however its prompt was chunked.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from . import lora_cpu

numba = lora_cpu.numba
AVAILABLE = lora_cpu.AVAILABLE
FASTMATH = lora_cpu.FASTMATH


def _decode_attention(out, q, k_cache, v_cache, block_tables, seq_lens, seqs, rows, scale, window, cap):
    """Numba body. q / out [T, Hq, D]; k_cache / v_cache [blocks, block_size, Hkv, D].

    For n in range(len(seqs)): sequence seqs[n] (its block_tables row and seq_lens entry)
    has its single query in row rows[n] of q, written to the same row of out. It sees the last
    ``window`` positions (0: all); ``cap`` > 0 soft-caps the scores (cap * tanh(s / cap)).
    """
    block_size = k_cache.shape[1]
    num_kv_heads = k_cache.shape[2]
    head_dim = k_cache.shape[3]
    group = q.shape[1] // num_kv_heads
    longest = 1
    for n in range(seqs.shape[0]):
        longest = max(longest, seq_lens[seqs[n]])
    scores = np.empty((group, longest), np.float32)  # [G, L]
    q_rows = np.empty((group, head_dim), np.float32)  # [G, D], contiguous copy of the queries
    acc = np.empty((group, head_dim), np.float32)  # [G, D]
    for n in range(seqs.shape[0]):
        seq = seqs[n]
        row = rows[n]
        length = seq_lens[seq]
        first = max(0, length - window) if window > 0 else 0
        for kv_head in range(num_kv_heads):
            head0 = kv_head * group
            for g in range(group):
                for d in range(head_dim):
                    q_rows[g, d] = q[row, head0 + g, d] * scale
            for p in range(first, length):
                k_row = k_cache[block_tables[seq, p // block_size], p % block_size, kv_head]  # [D]
                for g in range(group):
                    q_row = q_rows[g]
                    s = np.float32(0.0)
                    for d in range(head_dim):
                        s += q_row[d] * k_row[d]
                    scores[g, p] = s
            if cap > 0:
                for g in range(group):
                    for p in range(first, length):
                        scores[g, p] = cap * np.float32(math.tanh(scores[g, p] / cap))
            for g in range(group):
                top = -np.inf
                for p in range(first, length):
                    top = max(top, scores[g, p])
                total = np.float32(0.0)
                for p in range(first, length):
                    e = np.float32(math.exp(scores[g, p] - top))
                    scores[g, p] = e
                    total += e
                inv = np.float32(1.0) / total
                for p in range(first, length):
                    scores[g, p] *= inv
                acc[g, :] = 0.0
            for p in range(first, length):
                v_row = v_cache[block_tables[seq, p // block_size], p % block_size, kv_head]  # [D]
                for g in range(group):
                    w = scores[g, p]
                    a = acc[g]
                    for d in range(head_dim):
                        a[d] += w * v_row[d]
            for g in range(group):
                for d in range(head_dim):
                    out[row, head0 + g, d] = acc[g, d]


_kernel = numba.njit(fastmath=FASTMATH, nogil=True, cache=True)(_decode_attention) if AVAILABLE else None


def _rows_attention(out, q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, window, cap):
    """Numba body. q / out [T, Hq, D] float32 contiguous; k_cache / v_cache [blocks, block_size,
    Hkv, D] float32. Sequence n's queries are rows query_start_loc[n]..query_start_loc[n + 1],
    the last of them at position seq_lens[n] - 1; a query at a negative position gets zeros.
    Every query runs the same loops over its own positions lo..pos (lo = pos + 1 - window
    clamped at 0; 0 when window is 0), whatever the other rows; cap > 0 soft-caps the scores.
    """
    block_size = k_cache.shape[1]
    num_kv_heads = k_cache.shape[2]
    head_dim = k_cache.shape[3]
    group = q.shape[1] // num_kv_heads
    longest = 1
    for n in range(seq_lens.shape[0]):
        longest = max(longest, seq_lens[n])
    scores = np.empty((group, longest), np.float32)  # [G, L]
    q_rows = np.empty((group, head_dim), np.float32)  # [G, D]
    acc = np.empty((group, head_dim), np.float32)  # [G, D]
    for n in range(seq_lens.shape[0]):
        first = query_start_loc[n]
        q_len = query_start_loc[n + 1] - first
        for j in range(q_len):
            row = first + j
            length = seq_lens[n] - q_len + j + 1  # keys this query sees: positions 0..length-1
            if length <= 0:
                out[row] = 0.0
                continue
            lo = max(0, length - window) if window > 0 else 0
            for kv_head in range(num_kv_heads):
                head0 = kv_head * group
                for g in range(group):
                    for d in range(head_dim):
                        q_rows[g, d] = q[row, head0 + g, d] * scale
                for p in range(lo, length):
                    k_row = k_cache[block_tables[n, p // block_size], p % block_size, kv_head]  # [D]
                    for g in range(group):
                        q_row = q_rows[g]
                        s = np.float32(0.0)
                        for d in range(head_dim):
                            s += q_row[d] * k_row[d]
                        scores[g, p] = s
                if cap > 0:
                    for g in range(group):
                        for p in range(lo, length):
                            scores[g, p] = cap * np.float32(math.tanh(scores[g, p] / cap))
                for g in range(group):
                    top = -np.inf
                    for p in range(lo, length):
                        top = max(top, scores[g, p])
                    total = np.float32(0.0)
                    for p in range(lo, length):
                        e = np.float32(math.exp(scores[g, p] - top))
                        scores[g, p] = e
                        total += e
                    inv = np.float32(1.0) / total
                    for p in range(lo, length):
                        scores[g, p] *= inv
                    acc[g, :] = 0.0
                for p in range(lo, length):
                    v_row = v_cache[block_tables[n, p // block_size], p % block_size, kv_head]  # [D]
                    for g in range(group):
                        w = scores[g, p]
                        a = acc[g]
                        for d in range(head_dim):
                            a[d] += w * v_row[d]
                for g in range(group):
                    for d in range(head_dim):
                        out[row, head0 + g, d] = acc[g, d]


# One compiled function for every call (its arguments are always contiguous float32 / int32
# arrays): a query's loops, vectorised or not, depend only on its own length and the shapes.
_rows_kernel = numba.njit(fastmath=FASTMATH, nogil=True, cache=True)(_rows_attention) if AVAILABLE else None


def supports(q: torch.Tensor) -> bool:
    """Whether :func:`decode_attention` takes this query: float32 on the CPU, Numba present."""
    return AVAILABLE and q.dtype == torch.float32 and q.device.type == "cpu"


def decode_attention(
    out: torch.Tensor,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    seqs: list[int],
    rows: list[int],
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> None:
    """``out[rows[n]] = softmax(q[rows[n]] K^T * scale) V`` over sequence ``seqs[n]``'s cache
    (its last ``sliding_window`` keys; scores soft-capped when ``softcap`` is set).

    Shapes: q / out [T, Hq, D] float32; k_cache / v_cache [blocks, block_size, Hkv, D];
    block_tables [S, max_blocks]; seq_lens [S] (every listed sequence has length >= 1).
    Only the listed rows of ``out`` are written.
    """
    assert _kernel is not None  # callers check supports()
    _kernel(
        out.numpy(),
        q.numpy(),
        k_cache.numpy(),
        v_cache.numpy(),
        block_tables.numpy(),
        seq_lens.numpy(),
        np.asarray(seqs, dtype=np.int64),
        np.asarray(rows, dtype=np.int64),
        np.float32(scale),
        np.int64(sliding_window or 0),
        np.float32(softcap or 0.0),
    )


def invariant_attention(
    out: torch.Tensor,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> None:
    """Causal attention of every query row over the paged cache, batch-invariant (module docstring),
    with ``paged_attention``'s ``sliding_window`` and ``softcap``.

    Shapes as ``paged_attention``'s; any float dtype. A float32 cache is read in place; other
    dtypes are widened to float32 (exactly) for the blocks the step reads, through a table
    that maps each sequence's logical blocks to the gathered ones.
    """
    assert _rows_kernel is not None  # the plan builder refuses batch invariance without Numba
    if k_cache.dtype != torch.float32:
        counts = ((seq_lens.long() + k_cache.shape[1] - 1) // k_cache.shape[1]).tolist()
        width = block_tables.shape[1]
        used = torch.cat([block_tables[n, :c] for n, c in enumerate(counts)]).long()  # [B]
        k_cache = k_cache.index_select(0, used).float()  # [B, block_size, Hkv, D]
        v_cache = v_cache.index_select(0, used).float()
        starts = [0]
        for c in counts:
            starts.append(starts[-1] + c)
        block_tables = torch.tensor(
            [list(range(starts[n], starts[n] + c)) + [0] * (width - c) for n, c in enumerate(counts)],
            dtype=torch.int32,
        ).view(len(counts), width)  # [S, width]
    rows = torch.empty(q.shape, dtype=torch.float32)  # [T, Hq, D]
    _rows_kernel(
        rows.numpy(),
        q.float().contiguous().numpy(),
        k_cache.numpy(),
        v_cache.numpy(),
        block_tables.numpy(),
        seq_lens.numpy(),
        query_start_loc.numpy(),
        np.float32(scale),
        np.int64(sliding_window or 0),
        np.float32(softcap or 0.0),
    )
    end = int(query_start_loc[-1])
    out[:end].copy_(rows[:end])  # rows past the last query stay as they were


def compile_now() -> None:
    """Compile (or load from Numba's cache) the kernel for the engine's argument types."""
    if not AVAILABLE:
        return
    cache = torch.zeros(1, 2, 1, 4)  # [blocks, block_size, Hkv, D]
    tables = torch.zeros(2, 1, dtype=torch.int32)
    lens = torch.ones(2, dtype=torch.int32)
    for tokens in (1, 2):  # one row is contiguous; more rows of the fused qkv output are strided
        q = torch.zeros(tokens, 12)[:, :4].view(tokens, 1, 4)
        out = torch.empty(tokens, 1, 4)
        decode_attention(out, q, cache, cache, tables, lens, list(range(tokens)), list(range(tokens)), 1.0)
    starts = torch.tensor([0, 1, 2], dtype=torch.int32)
    invariant_attention(torch.empty(2, 1, 4), torch.zeros(2, 1, 4), cache, cache, tables, lens, starts, 1.0)
