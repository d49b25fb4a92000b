"""Decode attention over the paged KV cache for float32 on the CPU, compiled by Numba.

The torch path gathers every sequence's blocks into a padded copy and runs one masked SDPA
per layer (about 260 us a layer at 8 sequences of 160 tokens on two cores, mostly copies
and operation overhead). This kernel reads the keys and values in place through the block
table: for each sequence and KV head, the scores of its query heads (the GQA group) against
each position, a max-subtracted softmax, and the weighted sum of values, all in float32.
Single-threaded, without the GIL. Prefill sequences keep the torch path.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from . import lora_cpu

numba = lora_cpu.numba
AVAILABLE = lora_cpu.AVAILABLE
FASTMATH = lora_cpu.FASTMATH


def _decode_attention(out, q, k_cache, v_cache, block_tables, seq_lens, seqs, rows, scale):
    """Numba body. q / out [T, Hq, D]; k_cache / v_cache [blocks, block_size, Hkv, D].

    For n in range(len(seqs)): sequence seqs[n] (its block_tables row and seq_lens entry)
    has its single query in row rows[n] of q, written to the same row of out.
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
        for kv_head in range(num_kv_heads):
            head0 = kv_head * group
            for g in range(group):
                for d in range(head_dim):
                    q_rows[g, d] = q[row, head0 + g, d] * scale
            for p in range(length):
                k_row = k_cache[block_tables[seq, p // block_size], p % block_size, kv_head]  # [D]
                for g in range(group):
                    q_row = q_rows[g]
                    s = np.float32(0.0)
                    for d in range(head_dim):
                        s += q_row[d] * k_row[d]
                    scores[g, p] = s
            for g in range(group):
                top = -np.inf
                for p in range(length):
                    top = max(top, scores[g, p])
                total = np.float32(0.0)
                for p in range(length):
                    e = np.float32(math.exp(scores[g, p] - top))
                    scores[g, p] = e
                    total += e
                inv = np.float32(1.0) / total
                for p in range(length):
                    scores[g, p] *= inv
                acc[g, :] = 0.0
            for p in range(length):
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
) -> None:
    """``out[rows[n]] = softmax(q[rows[n]] K^T * scale) V`` over sequence ``seqs[n]``'s cache.

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
    )


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
