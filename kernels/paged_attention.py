"""Paged-KV attention for a step that mixes prefill chunks and decode tokens.

KV cache layout (per layer, allocated by the engine)::

    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim], contiguous
    slot = physical_block * block_size + offset_in_block
    k_cache.view(-1, num_kv_heads, head_dim)[slot] is the key of one token

Step metadata (one entry per sequence of the step)::

    query_start_loc: [num_seqs + 1] int32, sequence i's queries are q[qsl[i]:qsl[i + 1]]
    seq_lens:        [num_seqs] int32, context length INCLUDING this step's tokens
    block_tables:    [num_seqs, max_blocks_per_seq] int32, logical block -> physical block

Backends: ``"triton"`` (CUDA, or CPU under ``TRITON_INTERPRET=1``) and ``"torch"`` (the CPU
hot path). ``"auto"`` picks triton on CUDA, torch elsewhere.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

__all__ = ["paged_attention", "reference_paged_attention", "write_kv"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_BACKENDS = ("auto", "torch", "triton")
_TRITON_HEAD_DIMS = (16, 32, 64, 128, 256)


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _triton_usable(device: torch.device) -> bool:
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def _validate_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    out: torch.Tensor | None,
    max_query_len: int | None,
    backend: str,
) -> str:
    _check(backend in _BACKENDS, f"backend must be one of {_BACKENDS}, got {backend!r}")
    _check(q.dim() == 3, f"q must be [num_tokens, num_q_heads, head_dim], got {tuple(q.shape)}")
    _check(
        k_cache.dim() == 4,
        f"k_cache must be [num_blocks, block_size, num_kv_heads, head_dim], got {tuple(k_cache.shape)}",
    )
    _check(
        v_cache.shape == k_cache.shape,
        f"v_cache shape {tuple(v_cache.shape)} != k_cache shape {tuple(k_cache.shape)}",
    )
    num_tokens, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, cache_head_dim = k_cache.shape
    _check(
        cache_head_dim == head_dim,
        f"head_dim of q ({head_dim}) != head_dim of the cache ({cache_head_dim})",
    )
    _check(
        num_kv_heads > 0 and num_q_heads % num_kv_heads == 0,
        f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads ({num_kv_heads})",
    )
    _check(block_size > 0, "block_size must be positive")
    _check(q.dtype in _DTYPES, f"q dtype must be one of {_DTYPES}, got {q.dtype}")
    _check(
        k_cache.dtype == q.dtype and v_cache.dtype == q.dtype,
        f"k_cache/v_cache dtype ({k_cache.dtype}/{v_cache.dtype}) must equal q dtype ({q.dtype})",
    )
    _check(
        block_tables.dim() == 2 and block_tables.dtype == torch.int32,
        "block_tables must be a 2-D int32 tensor [num_seqs, max_blocks_per_seq], "
        f"got {block_tables.dtype} {tuple(block_tables.shape)}",
    )
    num_seqs = block_tables.shape[0]
    _check(
        seq_lens.dim() == 1 and seq_lens.dtype == torch.int32 and seq_lens.shape[0] == num_seqs,
        f"seq_lens must be int32 [num_seqs={num_seqs}], got {seq_lens.dtype} {tuple(seq_lens.shape)}",
    )
    _check(
        query_start_loc.dim() == 1
        and query_start_loc.dtype == torch.int32
        and query_start_loc.shape[0] == num_seqs + 1,
        f"query_start_loc must be int32 [num_seqs + 1 = {num_seqs + 1}], got "
        f"{query_start_loc.dtype} {tuple(query_start_loc.shape)}",
    )
    tensors = {
        "k_cache": k_cache,
        "v_cache": v_cache,
        "block_tables": block_tables,
        "seq_lens": seq_lens,
        "query_start_loc": query_start_loc,
    }
    if out is not None:
        tensors["out"] = out
    for name, t in tensors.items():
        _check(t.device == q.device, f"{name} is on {t.device} but q is on {q.device}")
    _check(q.stride(-1) == 1, "q must have a contiguous last dimension (stride 1)")
    for name in ("k_cache", "v_cache", "block_tables", "seq_lens", "query_start_loc"):
        _check(tensors[name].is_contiguous(), f"{name} must be contiguous")
    if out is not None:
        _check(
            out.shape == q.shape and out.dtype == q.dtype,
            f"out must be {tuple(q.shape)} {q.dtype}, got {tuple(out.shape)} {out.dtype}",
        )
        _check(out.stride(-1) == 1, "out must have a contiguous last dimension (stride 1)")
    if max_query_len is not None:
        _check(
            isinstance(max_query_len, int) and max_query_len >= 0,
            f"max_query_len must be a non-negative int or None, got {max_query_len!r}",
        )
    if backend == "auto":
        backend = "triton" if q.device.type == "cuda" else "torch"
    if backend == "triton":
        _check(
            _triton_usable(q.device),
            f"backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1), q is on {q.device}",
        )
        _check(
            head_dim in _TRITON_HEAD_DIMS,
            f"backend='triton' supports head_dim in {_TRITON_HEAD_DIMS}, got {head_dim}; use backend='torch'",
        )
    del num_tokens
    return backend


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    max_query_len: int | None = None,
    backend: str = "auto",
    num_splits: int | None = None,
) -> torch.Tensor:
    """Causal attention of this step's queries over a paged KV cache (prefill + decode mixed).

    Args:
        q: [T, Hq, D] queries of all sequences (last dim contiguous; fp32, bf16 or fp16).
        k_cache, v_cache: [num_blocks, block_size, Hkv, D], contiguous, same dtype as q,
            already holding this step's keys/values (see :func:`write_kv`).
        block_tables: [num_seqs, max_blocks_per_seq] int32, logical -> physical block.
        seq_lens: [num_seqs] int32 context length of each sequence including this step.
        query_start_loc: [num_seqs + 1] int32 cumulative query counts (starts at 0).
        scale: softmax scale, usually ``D ** -0.5``.
        out: optional [T, Hq, D] output (dtype of q, last dim contiguous).
        max_query_len: max over sequences of q_len, as a Python int. Pass it on CUDA to avoid a
            device->host sync (1 for a decode step: the decode kernel then handles sequences
            with q_len 0 or 1 only). None: computed from query_start_loc.
        backend: "auto" (triton on CUDA, torch elsewhere), "triton" or "torch".
        num_splits: triton decode only, split-K factor over the context (None: from shapes).

    Padding: rows of ``out`` past ``query_start_loc[-1]`` are not written (they keep what
    ``out`` held; uninitialised memory when ``out`` is None). A query whose absolute position
    is negative (e.g. a padding sequence with seq_len 0 and q_len 1) sees no key and gets zeros.
    A padding sequence with q_len 0 writes nothing. The triton path never syncs with the host
    when ``max_query_len`` is given, and its grid depends only on T, num_seqs, the cache and
    block-table shapes and ``max_query_len``: a decode step can be captured in a CUDA graph.

    Semantics:
        G = Hq // Hkv
        for i in range(num_seqs):
            s, e = query_start_loc[i], query_start_loc[i + 1]
            q_len, L = e - s, seq_lens[i]
            nb = -(-L // block_size)
            k = k_cache[block_tables[i, :nb]].flatten(0, 1)[:L].repeat_interleave(G, 1)
            v = v_cache[block_tables[i, :nb]].flatten(0, 1)[:L].repeat_interleave(G, 1)
            for j in range(q_len):
                pos = L - q_len + j              # absolute position of query s + j
                if pos < 0:
                    out[s + j] = 0
                    continue
                w = torch.einsum("hd,khd->hk", q[s + j].float(), k[: pos + 1].float())
                p = (w * scale).softmax(-1)      # float32
                out[s + j] = torch.einsum("hk,khd->hd", p, v[: pos + 1].float()).to(q.dtype)
    """
    backend = _validate_attention(
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out, max_query_len, backend
    )
    if out is None:
        out = torch.empty_like(q)
    if q.shape[0] == 0 or block_tables.shape[0] == 0:
        return out
    if backend == "torch":
        _torch_paged_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, out)
        return out
    # triton is imported on first use: CPU-only installs (no triton) still run the torch path
    from multilora_studio.kernels.paged_attention_triton import (
        launch_paged_attention,
    )

    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max().item())
    _check(num_splits is None or num_splits >= 1, f"num_splits must be >= 1, got {num_splits}")
    return launch_paged_attention(
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        scale,
        out,
        max_query_len,
        num_splits=num_splits,
    )


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write this step's keys/values into the paged cache, in place.

    Args:
        k, v: [T, Hkv, D] (last dim contiguous), dtype of the cache.
        k_cache, v_cache: [num_blocks, block_size, Hkv, D], contiguous.
        slot_mapping: [T] int64, ``block_id * block_size + offset``; negative = padding token.

    On CUDA one Triton launch, no host sync (CUDA-graph safe); elsewhere torch indexing.

    Semantics:
        keep = slot_mapping >= 0
        k_cache.view(-1, Hkv, D)[slot_mapping[keep]] = k[keep]
        v_cache.view(-1, Hkv, D)[slot_mapping[keep]] = v[keep]
    """
    _check(k.dim() == 3, f"k must be [num_tokens, num_kv_heads, head_dim], got {tuple(k.shape)}")
    _check(v.shape == k.shape, f"v shape {tuple(v.shape)} != k shape {tuple(k.shape)}")
    _check(
        k_cache.dim() == 4 and v_cache.shape == k_cache.shape,
        "k_cache/v_cache must both be [num_blocks, block_size, num_kv_heads, head_dim], got "
        f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}",
    )
    _check(
        k_cache.shape[2:] == k.shape[1:],
        f"k is [T, {k.shape[1]}, {k.shape[2]}] but the cache holds "
        f"[{k_cache.shape[2]}, {k_cache.shape[3]}] per slot",
    )
    _check(
        k.dtype == k_cache.dtype and v.dtype == k_cache.dtype and v_cache.dtype == k_cache.dtype,
        f"k/v/k_cache/v_cache dtypes must match, got {k.dtype}/{v.dtype}/{k_cache.dtype}/{v_cache.dtype}",
    )
    _check(
        slot_mapping.dim() == 1 and slot_mapping.dtype == torch.int64 and slot_mapping.shape[0] == k.shape[0],
        f"slot_mapping must be int64 [num_tokens={k.shape[0]}], got {slot_mapping.dtype} "
        f"{tuple(slot_mapping.shape)}",
    )
    for name, t in (
        ("v", v),
        ("k_cache", k_cache),
        ("v_cache", v_cache),
        ("slot_mapping", slot_mapping),
    ):
        _check(t.device == k.device, f"{name} is on {t.device} but k is on {k.device}")
    _check(k_cache.is_contiguous() and v_cache.is_contiguous(), "k_cache/v_cache must be contiguous")
    _check(k.stride(-1) == 1 and v.stride(-1) == 1, "k/v must have a contiguous last dimension")
    if k.shape[0] == 0:
        return
    if k.device.type == "cuda":
        from multilora_studio.kernels.paged_attention_triton import (
            launch_write_kv,
        )

        launch_write_kv(k, v, k_cache, v_cache, slot_mapping)
        return
    num_kv_heads, head_dim = k.shape[1:]
    k_flat = k_cache.view(-1, num_kv_heads, head_dim)  # [num_blocks * block_size, Hkv, D]
    v_flat = v_cache.view(-1, num_kv_heads, head_dim)
    if bool((slot_mapping >= 0).all()):
        k_flat[slot_mapping] = k
        v_flat[slot_mapping] = v
    else:
        keep = slot_mapping >= 0
        k_flat[slot_mapping[keep]] = k[keep]
        v_flat[slot_mapping[keep]] = v[keep]


def _gather_kv(cache: torch.Tensor, block_rows: torch.Tensor, num_blocks: int) -> torch.Tensor:
    # block_rows [S, >=num_blocks] -> [S, num_blocks * block_size, Hkv, D]
    _, block_size, num_kv_heads, head_dim = cache.shape
    g = cache[block_rows[:, :num_blocks]]  # [S, nb, bs, Hkv, D]
    return g.view(g.shape[0], num_blocks * block_size, num_kv_heads, head_dim)


def _torch_paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    out: torch.Tensor,
) -> None:
    """Torch path: one batched masked attention for all q_len == 1 sequences, then a loop over
    the prefill sequences (one SDPA each)."""
    _, num_q_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    compute = torch.float32
    qsl = query_start_loc.tolist()
    lens = seq_lens.tolist()
    dec_seqs: list[int] = []
    dec_tokens: list[int] = []
    pre_seqs: list[int] = []
    for i, length in enumerate(lens):
        q_len = qsl[i + 1] - qsl[i]
        if q_len == 0:
            continue
        if q_len > length:
            # queries with a negative position see no key
            out[qsl[i] : qsl[i + 1] - length].zero_()
            if length == 0:
                continue
        if q_len == 1:
            dec_seqs.append(i)
            dec_tokens.append(qsl[i])
        else:
            pre_seqs.append(i)

    if dec_seqs:
        num_dec = len(dec_seqs)
        max_len = max(lens[i] for i in dec_seqs)
        nb = -(-max_len // block_size)
        if num_dec == len(lens) and dec_tokens[-1] == num_dec - 1:
            rows = block_tables
            lens_t = seq_lens
            qd = q[:num_dec]
        else:
            idx = torch.tensor(dec_seqs, device=q.device)
            rows = block_tables[idx]
            lens_t = seq_lens[idx]
            qd = q[torch.tensor(dec_tokens, device=q.device)]
        k = _gather_kv(k_cache, rows, nb)  # [S, L, Hkv, D]
        v = _gather_kv(v_cache, rows, nb)
        qd = qd.view(num_dec, num_kv_heads, group, head_dim)
        if qd.dtype != compute:
            qd, k, v = qd.to(compute), k.to(compute), v.to(compute)
        scores = torch.matmul(qd, k.permute(0, 2, 3, 1))  # [S, Hkv, G, L]
        key_pos = torch.arange(nb * block_size, device=q.device)
        hidden = key_pos[None, :] >= lens_t[:, None]  # [S, L]
        scores.mul_(scale).masked_fill_(hidden[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        o = torch.matmul(probs, v.transpose(1, 2))  # [S, Hkv, G, D]
        o = o.reshape(num_dec, num_q_heads, head_dim).to(out.dtype)
        if num_dec == len(lens) and dec_tokens[-1] == num_dec - 1:
            out[:num_dec] = o
        else:
            out[torch.tensor(dec_tokens, device=q.device)] = o

    for i in pre_seqs:
        length = lens[i]
        q_end = qsl[i + 1]
        q_len = min(q_end - qsl[i], length)  # rows with a negative position are already zero
        ctx = length - q_len
        nb = -(-length // block_size)
        k = _gather_kv(k_cache, block_tables[i : i + 1], nb)[0, :length]  # [L, Hkv, D]
        v = _gather_kv(v_cache, block_tables[i : i + 1], nb)[0, :length]
        qi = q[q_end - q_len : q_end].transpose(0, 1)  # [Hq, q_len, D]
        k = k.transpose(0, 1)  # [Hkv, L, D]
        v = v.transpose(0, 1)
        if qi.dtype != compute:
            qi, k, v = qi.to(compute), k.to(compute), v.to(compute)
        if group > 1:
            k = k.repeat_interleave(group, dim=0)  # [Hq, L, D]
            v = v.repeat_interleave(group, dim=0)
        if ctx == 0:
            o = F.scaled_dot_product_attention(qi, k, v, is_causal=True, scale=scale)
        else:
            visible = torch.arange(length, device=q.device)[None, :] <= (
                ctx + torch.arange(q_len, device=q.device)[:, None]
            )  # [q_len, L]
            o = F.scaled_dot_product_attention(qi, k, v, attn_mask=visible, scale=scale)
        out[q_end - q_len : q_end] = o.transpose(0, 1)


def reference_paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Float64 reference of :func:`paged_attention` (slow; for tests).

    Returns a float64 [T, Hq, D] tensor on the CPU; rows past ``query_start_loc[-1]`` are zero.
    """
    num_tokens, num_q_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    qd = q.detach().cpu().double()
    kc = k_cache.detach().cpu().double()
    vc = v_cache.detach().cpu().double()
    tables = block_tables.cpu()
    qsl = query_start_loc.tolist()
    out = torch.zeros(num_tokens, num_q_heads, head_dim, dtype=torch.float64)
    for i, length in enumerate(seq_lens.tolist()):
        s, e = qsl[i], qsl[i + 1]
        q_len = e - s
        if q_len == 0 or length == 0:
            continue
        nb = -(-length // block_size)
        k = kc[tables[i, :nb].long()].reshape(-1, num_kv_heads, head_dim)[:length]
        v = vc[tables[i, :nb].long()].reshape(-1, num_kv_heads, head_dim)[:length]
        k = k.repeat_interleave(group, dim=1)  # [L, Hq, D]
        v = v.repeat_interleave(group, dim=1)
        w = torch.einsum("qhd,khd->hqk", qd[s:e], k) * scale  # [Hq, q_len, L]
        pos = length - q_len + torch.arange(q_len)
        visible = torch.arange(length)[None, :] <= pos[:, None]  # [q_len, L]
        w = w.masked_fill(~visible, float("-inf"))
        p = torch.softmax(w, dim=-1).nan_to_num(0.0)  # rows with a negative position: zeros
        out[s:e] = torch.einsum("hqk,khd->qhd", p, v)
    return out
