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

import math
from typing import Any

import torch
import torch.nn.functional as F

from . import paged_attention_cpu
from .triton_support import triton_runs_on

__all__ = ["paged_attention", "reference_paged_attention", "write_kv"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_BACKENDS = ("auto", "torch", "triton", "numba")
_TRITON_HEAD_DIMS = (16, 32, 64, 128, 256)
# F.scaled_dot_product_attention(enable_gqa=...) exists from torch 2.5
_SDPA_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)


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
    sliding_window: int | None,
    softcap: float | None,
) -> str:
    """Raise ValueError naming the problem; return the resolved backend. Messages are
    formatted only on failure: this runs once per layer per step."""
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
    if q.dim() != 3:
        raise ValueError(f"q must be [num_tokens, num_q_heads, head_dim], got {tuple(q.shape)}")
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError(
            "k_cache and v_cache must both be [num_blocks, block_size, num_kv_heads, head_dim], "
            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    _, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, cache_head_dim = k_cache.shape
    if cache_head_dim != head_dim:
        raise ValueError(f"head_dim of q ({head_dim}) != head_dim of the cache ({cache_head_dim})")
    if num_kv_heads == 0 or num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if block_size == 0:
        raise ValueError("block_size must be positive")
    if q.dtype not in _DTYPES:
        raise ValueError(f"q dtype must be one of {_DTYPES}, got {q.dtype}")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(
            f"k_cache/v_cache dtype ({k_cache.dtype}/{v_cache.dtype}) must equal q dtype ({q.dtype})"
        )
    if block_tables.dim() != 2 or block_tables.dtype != torch.int32:
        raise ValueError(
            "block_tables must be a 2-D int32 tensor [num_seqs, max_blocks_per_seq], "
            f"got {block_tables.dtype} {tuple(block_tables.shape)}"
        )
    num_seqs = block_tables.shape[0]
    if seq_lens.dim() != 1 or seq_lens.dtype != torch.int32 or seq_lens.shape[0] != num_seqs:
        raise ValueError(
            f"seq_lens must be int32 [num_seqs={num_seqs}], got {seq_lens.dtype} {tuple(seq_lens.shape)}"
        )
    if (
        query_start_loc.dim() != 1
        or query_start_loc.dtype != torch.int32
        or query_start_loc.shape[0] != num_seqs + 1
    ):
        raise ValueError(
            f"query_start_loc must be int32 [num_seqs + 1 = {num_seqs + 1}], got "
            f"{query_start_loc.dtype} {tuple(query_start_loc.shape)}"
        )
    device = q.device
    named = (
        ("k_cache", k_cache),
        ("v_cache", v_cache),
        ("block_tables", block_tables),
        ("seq_lens", seq_lens),
        ("query_start_loc", query_start_loc),
    )
    for name, t in named:
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but q is on {device}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if q.stride(-1) != 1:
        raise ValueError("q must have a contiguous last dimension (stride 1)")
    if out is not None:
        if out.device != device:
            raise ValueError(f"out is on {out.device} but q is on {device}")
        if out.shape != q.shape or out.dtype != q.dtype:
            raise ValueError(f"out must be {tuple(q.shape)} {q.dtype}, got {tuple(out.shape)} {out.dtype}")
        if out.stride(-1) != 1:
            raise ValueError("out must have a contiguous last dimension (stride 1)")
    if max_query_len is not None and not (isinstance(max_query_len, int) and max_query_len >= 0):
        raise ValueError(f"max_query_len must be a non-negative int or None, got {max_query_len!r}")
    if sliding_window is not None and not (
        isinstance(sliding_window, int) and not isinstance(sliding_window, bool) and sliding_window >= 1
    ):
        raise ValueError(f"sliding_window must be a positive int or None, got {sliding_window!r}")
    if softcap is not None and not (
        isinstance(softcap, (int, float))
        and not isinstance(softcap, bool)
        and math.isfinite(softcap)
        and softcap > 0
    ):
        raise ValueError(f"softcap must be a positive finite float or None, got {softcap!r}")
    if backend == "auto":
        if device.type == "cuda":
            return "triton"
        return "numba" if paged_attention_cpu.supports(q) else "torch"
    if backend == "numba" and not paged_attention_cpu.supports(q):
        raise ValueError(f"backend='numba' needs float32 CPU tensors and Numba, q is {q.dtype} on {device}")
    if backend == "triton":
        if not triton_runs_on(device):
            raise ValueError(f"backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1), q is on {device}")
        if head_dim not in _TRITON_HEAD_DIMS:
            raise ValueError(
                f"backend='triton' supports head_dim in {_TRITON_HEAD_DIMS}, got {head_dim}; "
                "use backend='torch'"
            )
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
    batch_invariant: bool = False,
    sliding_window: int | None = None,
    softcap: float | None = None,
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
        backend: "auto" (triton on CUDA; on the CPU numba for float32, torch otherwise),
            "triton", "torch" or "numba" (decode rows through the Numba kernel in
            ``paged_attention_cpu``, prefill rows as torch; float32 only).
        num_splits: triton decode only, split-K factor over the context (None: from shapes).
        batch_invariant: every query computed in one fixed order whatever the step holds
            (decode, prefill chunk or mixed; keys from earlier steps or this one): on the CPU
            ``paged_attention_cpu.invariant_attention`` (float32, every row); with
            triton the unified kernel at fixed tile sizes for every step, never split-K.
        sliding_window: a positive Python int: each query sees its last ``sliding_window``
            positions, itself included (HF's ``kv_idx > q_idx - sliding_window``); None: all.
            A runtime value: one compiled variant serves every window.
        softcap: a positive finite Python float: scores ``s = (q . k) * scale`` become
            ``softcap * tanh(s / softcap)`` before the softmax (Gemma 2's attention logit
            soft-capping); None: no cap.

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
                lo = 0 if sliding_window is None else max(0, pos + 1 - sliding_window)
                w = torch.einsum("hd,khd->hk", q[s + j].float(), k[lo : pos + 1].float()) * scale
                if softcap is not None:
                    w = softcap * torch.tanh(w / softcap)
                p = w.softmax(-1)                # float32
                out[s + j] = torch.einsum("hk,khd->hd", p, v[lo : pos + 1].float()).to(q.dtype)
    """
    backend = _validate_attention(
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out, max_query_len, backend,
        sliding_window, softcap,
    )  # fmt: skip
    if softcap is not None:
        softcap = float(softcap)
    if out is None:
        out = torch.empty_like(q)
    if q.shape[0] == 0 or block_tables.shape[0] == 0:
        return out
    if batch_invariant and backend != "triton":
        if not paged_attention_cpu.AVAILABLE:
            raise ValueError("batch_invariant attention on the CPU needs Numba")
        paged_attention_cpu.invariant_attention(
            out, q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, sliding_window, softcap
        )
        return out
    if backend in ("torch", "numba"):
        _torch_paged_attention(
            q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, out,
            backend == "numba", sliding_window, softcap,
        )  # fmt: skip
        return out
    # triton is imported on first use: CPU-only installs (no triton) still run the torch path
    from multilora_studio.kernels.paged_attention_triton import (
        launch_paged_attention,
    )

    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max().item())
    if not (num_splits is None or num_splits >= 1):
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
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
        batch_invariant=batch_invariant,
        sliding_window=sliding_window,
        softcap=softcap,
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
    if k.dim() != 3 or v.shape != k.shape:
        raise ValueError(
            "k and v must both be [num_tokens, num_kv_heads, head_dim], got "
            f"{tuple(k.shape)} and {tuple(v.shape)}"
        )
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError(
            "k_cache/v_cache must both be [num_blocks, block_size, num_kv_heads, head_dim], got "
            f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    if k_cache.shape[2:] != k.shape[1:]:
        raise ValueError(
            f"k is [T, {k.shape[1]}, {k.shape[2]}] but the cache holds "
            f"[{k_cache.shape[2]}, {k_cache.shape[3]}] per slot"
        )
    if not (k.dtype == v.dtype == k_cache.dtype == v_cache.dtype):
        raise ValueError(
            f"k/v/k_cache/v_cache dtypes must match, got {k.dtype}/{v.dtype}/{k_cache.dtype}/{v_cache.dtype}"
        )
    if slot_mapping.dim() != 1 or slot_mapping.dtype != torch.int64 or slot_mapping.shape[0] != k.shape[0]:
        raise ValueError(
            f"slot_mapping must be int64 [num_tokens={k.shape[0]}], got {slot_mapping.dtype} "
            f"{tuple(slot_mapping.shape)}"
        )
    for name, t in (("v", v), ("k_cache", k_cache), ("v_cache", v_cache), ("slot_mapping", slot_mapping)):
        if t.device != k.device:
            raise ValueError(f"{name} is on {t.device} but k is on {k.device}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache/v_cache must be contiguous")
    if k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("k/v must have a contiguous last dimension")
    if k.shape[0] == 0:
        return
    if k.device.type == "cuda":
        from multilora_studio.kernels.paged_attention_triton import launch_write_kv

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


def _gather_kv(cache: torch.Tensor, block_ids: torch.Tensor, num_seqs: int) -> torch.Tensor:
    """Blocks ``block_ids`` ([num_seqs * nb]) of ``cache`` -> [num_seqs, nb * block_size, Hkv, D].

    index_select on whole blocks (row copies) is several times faster on CPU than advanced
    indexing of the 4-D cache.
    """
    num_kv_heads, head_dim = cache.shape[2:]
    g = cache.index_select(0, block_ids)  # [S * nb, bs, Hkv, D]
    return g.view(num_seqs, -1, num_kv_heads, head_dim)


def _capped_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    visible: torch.Tensor | None,
    scale: float,
    softcap: float,
) -> torch.Tensor:
    """Soft-capped attention, which SDPA cannot express: float32 scores, cap, masked softmax.

    q [..., M, D]; k, v [..., L, D] (broadcast against q's leading dims); visible broadcasts to
    [..., M, L] (None: all). Every row sees at least one key. Returns [..., M, D] in q's dtype.
    """
    w = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale  # [..., M, L]
    w = softcap * torch.tanh(w / softcap)
    if visible is not None:
        w = w.masked_fill(~visible, float("-inf"))
    return torch.matmul(w.softmax(-1), v.float()).to(q.dtype)


def _torch_paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    decode_kernel: bool = False,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> None:
    """Torch path: one batched masked SDPA for all q_len == 1 sequences (or, with
    ``decode_kernel``, the Numba kernel reading the cache in place), then one SDPA per
    prefill sequence. SDPA keeps bf16/fp16 inputs and accumulates (softmax too) in float32.
    With ``softcap`` the same steps compute explicitly in float32 (:func:`_capped_attention`)."""
    _, num_q_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    qsl = query_start_loc.tolist()
    lens = seq_lens.tolist()
    dec_seqs: list[int] = []
    pre_seqs: list[int] = []
    for i, length in enumerate(lens):
        q_len = qsl[i + 1] - qsl[i]
        if q_len == 0:
            continue
        if q_len > length:  # queries with a negative position see no key
            out[qsl[i] : qsl[i + 1] - length].zero_()
            if length == 0:
                continue
        if q_len == 1:
            dec_seqs.append(i)
        else:
            pre_seqs.append(i)

    if dec_seqs and decode_kernel:
        query_rows = [qsl[i] for i in dec_seqs]
        paged_attention_cpu.decode_attention(
            out, q, k_cache, v_cache, block_tables, seq_lens, dec_seqs, query_rows, scale,
            sliding_window, softcap,
        )  # fmt: skip
    elif dec_seqs:
        num_dec = len(dec_seqs)
        nb = -(-max(lens[i] for i in dec_seqs) // block_size)
        # a plain decode step: sequence i's query is token i
        plain = num_dec == len(lens) and qsl[num_dec] == num_dec
        if plain:
            rows, lens_t, qd = block_tables, seq_lens, q[:num_dec]
        else:
            seq_idx = torch.tensor(dec_seqs, device=q.device)
            tok_idx = torch.tensor([qsl[i] for i in dec_seqs], device=q.device)
            rows, lens_t, qd = block_tables[seq_idx], seq_lens[seq_idx], q[tok_idx]
        # Table entries past a sequence's last block may hold anything (they are masked): clamp.
        ids = rows[:, :nb].reshape(-1)
        if num_dec > 1:
            ids = ids.clamp(0, k_cache.shape[0] - 1)
        k = _gather_kv(k_cache, ids, num_dec).transpose(1, 2)  # [S, Hkv, L, D]
        v = _gather_kv(v_cache, ids, num_dec).transpose(1, 2)
        if num_dec == 1:
            length = lens[dec_seqs[0]]
            first = 0 if sliding_window is None else max(0, length - sliding_window)
            k, v, mask = k[:, :, first:length], v[:, :, first:length], None
        else:
            key_pos = torch.arange(nb * block_size, device=q.device)
            visible = key_pos < lens_t[:, None]  # [S, L]
            if sliding_window is not None:
                visible &= key_pos >= lens_t[:, None] - sliding_window
            mask = visible[:, None, None, :]
        # the G query heads of one KV head act as G query rows of that head: no K/V repeat
        qg = qd.reshape(num_dec, num_kv_heads, group, head_dim)
        if softcap is None:
            o = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scale)  # [S, Hkv, G, D]
        else:
            o = _capped_attention(qg, k, v, mask, scale, softcap)
        o = o.reshape(num_dec, num_q_heads, head_dim)
        if plain:
            out[:num_dec] = o
        else:
            out[tok_idx] = o

    for i in pre_seqs:
        length = lens[i]
        q_end = qsl[i + 1]
        q_len = min(q_end - qsl[i], length)  # rows with a negative position are already zero
        ctx = length - q_len
        # keys [first, length): the window of the first query onwards, from its block
        first = 0 if sliding_window is None else max(0, ctx + 1 - sliding_window)
        b0, nb = first // block_size, -(-length // block_size)
        ids = block_tables[i, b0:nb]
        k = _gather_kv(k_cache, ids, 1)[0, first - b0 * block_size : length - b0 * block_size]
        v = _gather_kv(v_cache, ids, 1)[0, first - b0 * block_size : length - b0 * block_size]
        k, v = k.transpose(0, 1), v.transpose(0, 1)  # [Hkv, L - first, D]
        qi = q[q_end - q_len : q_end].transpose(0, 1)  # [Hq, q_len, D]
        if ctx == 0 and sliding_window is None:
            allowed = None  # causal
        else:
            key_pos = torch.arange(first, length, device=q.device)
            q_pos = ctx + torch.arange(q_len, device=q.device)[:, None]
            allowed = key_pos <= q_pos  # [q_len, L - first]
            if sliding_window is not None:
                allowed &= key_pos > q_pos - sliding_window
        if softcap is not None:
            if allowed is None:
                allowed = torch.ones(q_len, length, dtype=torch.bool, device=q.device).tril()
            # the G query heads of KV head h are rows [h, :] of [Hkv, G * q_len, D]
            o = _capped_attention(
                qi.reshape(num_kv_heads, group * q_len, head_dim), k, v,
                allowed.repeat(group, 1), scale, softcap,
            ).view(num_q_heads, q_len, head_dim)  # fmt: skip
        else:
            if group > 1 and not _SDPA_GQA:
                k = k.repeat_interleave(group, dim=0)
                v = v.repeat_interleave(group, dim=0)
            gqa: dict[str, Any] = {"enable_gqa": True} if group > 1 and _SDPA_GQA else {}
            if allowed is None:
                o = F.scaled_dot_product_attention(qi, k, v, is_causal=True, scale=scale, **gqa)
            else:
                o = F.scaled_dot_product_attention(qi, k, v, attn_mask=allowed, scale=scale, **gqa)
        out[q_end - q_len : q_end] = o.transpose(0, 1)


def reference_paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Float64 reference of :func:`paged_attention` (slow; for tests and the GPU bench).

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
        if softcap is not None:
            w = softcap * torch.tanh(w / softcap)
        pos = length - q_len + torch.arange(q_len)
        visible = torch.arange(length)[None, :] <= pos[:, None]  # [q_len, L]
        if sliding_window is not None:
            visible &= torch.arange(length)[None, :] > pos[:, None] - sliding_window
        w = w.masked_fill(~visible, float("-inf"))
        p = torch.softmax(w, dim=-1).nan_to_num(0.0)  # rows with a negative position: zeros
        out[s:e] = torch.einsum("hqk,khd->qhd", p, v)
    return out
