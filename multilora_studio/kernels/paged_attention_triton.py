"""Triton kernels for paged-KV attention and the KV-cache write.

Import only through :mod:`multilora_studio.kernels.paged_attention`, whose wrappers check
shapes, dtypes and devices; the launchers here trust their inputs.

Kernels
-------
``_paged_attn_kernel``: one program = one tile of ``BLOCK_Q`` query tokens of one sequence
times the ``GROUP`` query heads that share one KV head (GQA heads are packed into the rows of
the tile, so every K/V tile is read once per KV head, not once per query head). Rows of a tile:
``row = token_in_tile * G_PAD + head_in_group``. Two loops over the keys: tiles every query of
the tile may see (no mask), then the tiles on the causal diagonal (masked).

- Unified mode (``DECODE=False``, any mix of prefill chunks and decode tokens): grid
  ``(T // BLOCK_Q + num_seqs, Hkv, 1)``. Sequence ``i`` owns programs starting at
  ``query_start_loc[i] // BLOCK_Q + i`` (an upper bound on the tiles it needs), found by binary
  search; programs past a sequence's last tile exit at once.
- Decode mode (``DECODE=True``, every sequence has ``q_len <= 1``): grid
  ``(num_seqs, Hkv, num_splits)``. With ``num_splits > 1`` the context of each sequence is cut
  into ``num_splits`` contiguous ranges (split-K); each program writes an unnormalised partial
  result (acc, running max, running sum) to a float32 workspace and ``_combine_splits_kernel``
  merges them.

Both grids depend only on shapes and Python ints, never on tensor values: a decode step can be
captured in a CUDA graph.

``_write_kv_kernel``: one program per token, copies its K and V rows into the cache slot
``slot_mapping[t]``; negative slots (padding tokens) are skipped.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

# Masked score value and initial running max. Finite, so a row that sees no key in a tile
# (or at all) never computes inf - inf.
_NEG_BIG = tl.constexpr(-1.0e30)


@triton.jit
def _find_seq(qsl_ptr, num_seqs, target, BLOCK_Q: tl.constexpr):
    # Largest i with query_start_loc[i] // BLOCK_Q + i <= target.
    lo: tl.int32 = 0
    hi: tl.int32 = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        val = tl.load(qsl_ptr + mid) // BLOCK_Q + mid
        if val <= target:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _attn_tiles(
    acc,
    l_i,
    m_i,
    q,
    k_base,
    v_base,
    bt_row,
    start,
    end,
    q_pos,
    scale_log2,
    cap_log2,
    window,
    stride_kb,
    stride_ks,
    stride_vb,
    stride_vs,
    MASKED: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr,
    DOT_MODE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    # Keys [start, end) of one sequence and one KV head; start is a multiple of BLOCK_N.
    # Unmasked calls only get full tiles that every row of the tile may see. With SOFTCAP,
    # scale_log2 is scale / softcap and cap_log2 is softcap * log2(e): s = softcap * tanh(s / softcap).
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + offs_n  # [BLOCK_N] absolute key positions
        if MASKED:
            in_range = pos < end
            blk = tl.load(bt_row + pos // BLOCK_SIZE, mask=in_range, other=0).to(tl.int64)
        else:
            blk = tl.load(bt_row + pos // BLOCK_SIZE).to(tl.int64)
        slot_in_blk = pos % BLOCK_SIZE
        k_offs = blk * stride_kb + slot_in_blk * stride_ks  # [BLOCK_N]
        v_offs = blk * stride_vb + slot_in_blk * stride_vs  # [BLOCK_N]
        k_ptrs = k_base + k_offs[None, :] + offs_d[:, None]  # [D, BLOCK_N]
        v_ptrs = v_base + v_offs[:, None] + offs_d[None, :]  # [BLOCK_N, D]
        k = tl.load(k_ptrs, mask=in_range[None, :], other=0.0) if MASKED else tl.load(k_ptrs)
        if DOT_MODE == 1:
            s = tl.dot(q.to(tl.float32), k.to(tl.float32), input_precision="ieee")
        elif DOT_MODE == 2:
            s = tl.dot(q, k, input_precision="tf32x3")
        else:
            s = tl.dot(q, k)
        s = s * scale_log2  # [BLOCK_M, BLOCK_N], log2 units (SOFTCAP: s / softcap, natural units)
        if SOFTCAP:
            # tanh from exp2 (no tanh in tl.math): e = exp(-2|x|), tanh(x) = sign(x) (1 - e) / (1 + e)
            e = tl.exp2(tl.abs(s) * -2.8853900817779268)  # -2 * log2(e)
            t = (1.0 - e) / (1.0 + e)
            s = tl.where(s < 0, -t, t) * cap_log2
        if MASKED:
            visible = (pos[None, :] <= q_pos[:, None]) & in_range[None, :]
            if HAS_WINDOW:
                visible = visible & (pos[None, :] > q_pos[:, None] - window)
            s = tl.where(visible, s, _NEG_BIG)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        if MASKED:
            p = tl.where(visible, p, 0.0)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptrs, mask=in_range[:, None], other=0.0) if MASKED else tl.load(v_ptrs)
        if DOT_MODE == 1:
            pv = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32), input_precision="ieee")
        elif DOT_MODE == 2:
            pv = tl.dot(p, v, input_precision="tf32x3")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return acc, l_i, m_i


# The sequence count and the block-table width change every step, the window from layer to
# layer: not specialised, so a new value never compiles a variant in the middle of serving.
@triton.jit(do_not_specialize=["num_seqs", "stride_bt", "window"])
def _paged_attn_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    bt_ptr,
    seq_lens_ptr,
    qsl_ptr,
    ws_acc_ptr,
    ws_ml_ptr,
    scale_log2,
    cap_log2,
    window,
    num_seqs,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_bt,
    NUM_Q_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    G_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    DECODE: tl.constexpr,
    SPLIT: tl.constexpr,
    DOT_MODE: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    pid = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    if DECODE:
        seq = pid
        q_tile = 0
    else:
        seq = _find_seq(qsl_ptr, num_seqs, pid, BLOCK_Q)
        q_tile = pid - (tl.load(qsl_ptr + seq) // BLOCK_Q + seq)
    q_start = tl.load(qsl_ptr + seq)
    q_len = tl.load(qsl_ptr + seq + 1) - q_start
    tile_start = q_tile * BLOCK_Q
    if tile_start >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    ctx = seq_len - q_len  # keys before this step's first query

    rows = tl.arange(0, BLOCK_M)
    q_idx = tile_start + rows // G_PAD  # [BLOCK_M] query index within the sequence
    g = rows % G_PAD
    row_ok = (rows // G_PAD < BLOCK_Q) & (q_idx < q_len) & (g < GROUP)
    head = kvh * GROUP + g  # [BLOCK_M] query head
    offs_d = tl.arange(0, HEAD_DIM)
    tok = (q_start + q_idx).to(tl.int64)
    q_ptrs = q_ptr + tok[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)  # [BLOCK_M, D]
    q_pos = ctx + q_idx  # absolute position of each row's query

    tile_end = tl.minimum(q_len, tile_start + BLOCK_Q)
    kv_end = tl.maximum(tl.minimum(seq_len, ctx + tile_end), 0)  # keys any row may see
    full_end = (tl.maximum(ctx + tile_start + 1, 0) // BLOCK_N) * BLOCK_N  # seen by all rows
    if HAS_WINDOW:
        # Keys [first, kv_end) are seen by some row: tiles before the window of the tile's first
        # query are skipped. Tiles [edge, ...) start past the window edge of its last query.
        first = (tl.maximum(ctx + tile_start - window + 1, 0) // BLOCK_N) * BLOCK_N
        edge = tl.cdiv(tl.maximum(ctx + tile_end - window, 0), BLOCK_N) * BLOCK_N
    else:
        first = 0
        edge = 0
    free_end = tl.maximum(edge, full_end)  # tiles [edge, free_end): no mask
    per_split = tl.cdiv(tl.cdiv(kv_end - first, num_splits), BLOCK_N) * BLOCK_N
    lo = first + split * per_split
    hi = tl.minimum(lo + per_split, kv_end)

    bt_row = bt_ptr + seq.to(tl.int64) * stride_bt
    k_base = k_ptr + kvh * stride_kh
    v_base = v_ptr + kvh * stride_vh
    m_i = tl.full([BLOCK_M], _NEG_BIG, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    if HAS_WINDOW:  # tiles cut by the window's lower edge
        acc, l_i, m_i = _attn_tiles(
            acc, l_i, m_i, q, k_base, v_base, bt_row, lo, tl.minimum(tl.minimum(hi, edge), kv_end),
            q_pos, scale_log2, cap_log2, window, stride_kb, stride_ks, stride_vb, stride_vs,
            True, HAS_WINDOW, SOFTCAP, DOT_MODE, BLOCK_N, HEAD_DIM, BLOCK_SIZE,
        )  # fmt: skip
    acc, l_i, m_i = _attn_tiles(
        acc, l_i, m_i, q, k_base, v_base, bt_row, tl.maximum(lo, edge), tl.minimum(hi, free_end),
        q_pos, scale_log2, cap_log2, window, stride_kb, stride_ks, stride_vb, stride_vs,
        False, HAS_WINDOW, SOFTCAP, DOT_MODE, BLOCK_N, HEAD_DIM, BLOCK_SIZE,
    )  # fmt: skip
    acc, l_i, m_i = _attn_tiles(
        acc, l_i, m_i, q, k_base, v_base, bt_row, tl.maximum(lo, free_end), hi,
        q_pos, scale_log2, cap_log2, window, stride_kb, stride_ks, stride_vb, stride_vs,
        True, HAS_WINDOW, SOFTCAP, DOT_MODE, BLOCK_N, HEAD_DIM, BLOCK_SIZE,
    )  # fmt: skip

    if SPLIT:
        # Workspace rows: [num_seqs, Hq, num_splits, D] and [num_seqs, Hq, num_splits, 2].
        ws_row = (seq.to(tl.int64) * NUM_Q_HEADS + head) * num_splits + split  # [BLOCK_M]
        ws_ptrs = ws_acc_ptr + ws_row[:, None] * HEAD_DIM + offs_d[None, :]
        tl.store(ws_ptrs, acc, mask=row_ok[:, None])
        tl.store(ws_ml_ptr + ws_row * 2, m_i, mask=row_ok)
        tl.store(ws_ml_ptr + ws_row * 2 + 1, l_i, mask=row_ok)
    else:
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)  # rows that see no key get zeros
        o = acc / l_safe[:, None]
        o_ptrs = o_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, o.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit(do_not_specialize=["num_splits"])
def _combine_splits_kernel(
    o_ptr,
    qsl_ptr,
    ws_acc_ptr,
    ws_ml_ptr,
    num_splits,
    stride_ot,
    stride_oh,
    NUM_Q_HEADS: tl.constexpr,
    S_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    q_start = tl.load(qsl_ptr + seq)
    if tl.load(qsl_ptr + seq + 1) == q_start:
        return
    offs_s = tl.arange(0, S_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    s_ok = offs_s < num_splits
    ws_row = (seq.to(tl.int64) * NUM_Q_HEADS + head) * num_splits + offs_s  # [S_PAD]
    m = tl.load(ws_ml_ptr + ws_row * 2, mask=s_ok, other=float("-inf"))
    l_s = tl.load(ws_ml_ptr + ws_row * 2 + 1, mask=s_ok, other=0.0)
    acc = tl.load(ws_acc_ptr + ws_row[:, None] * HEAD_DIM + offs_d[None, :],
                  mask=s_ok[:, None], other=0.0)  # fmt: skip
    w = tl.exp2(m - tl.max(m, 0))  # [S_PAD]
    denom = tl.sum(w * l_s, 0)
    denom = tl.where(denom == 0.0, 1.0, denom)
    o = tl.sum(acc * w[:, None], 0) / denom  # [D]
    o_ptrs = o_ptr + q_start.to(tl.int64) * stride_ot + head * stride_oh + offs_d
    tl.store(o_ptrs, o.to(o_ptr.dtype.element_ty))


@triton.jit
def _write_kv_kernel(
    k_ptr,
    v_ptr,
    kc_ptr,
    vc_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    NUM_KV_HEADS: tl.constexpr,
    H_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t)
    if slot < 0:
        return
    h = tl.arange(0, H_PAD)[:, None]
    d = tl.arange(0, D_PAD)[None, :]
    mask = (h < NUM_KV_HEADS) & (d < HEAD_DIM)
    dst = slot * (NUM_KV_HEADS * HEAD_DIM) + h * HEAD_DIM + d  # cache rows are contiguous
    k = tl.load(k_ptr + t * stride_kt + h * stride_kh + d, mask=mask)
    tl.store(kc_ptr + dst, k, mask=mask)
    v = tl.load(v_ptr + t * stride_vt + h * stride_vh + d, mask=mask)
    tl.store(vc_ptr + dst, v, mask=mask)


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # interpreter on CPU: small, so that tests exercise split-K


def decode_num_splits(num_seqs: int, num_kv_heads: int, max_context: int, num_sms: int) -> int:
    """Split-K factor for a decode launch, from shapes only (safe under CUDA graphs).

    Enough programs to fill about two waves of the GPU, but at least 256 keys per split of the
    longest possible context (``max_blocks_per_seq * block_size``).
    """
    programs = num_seqs * num_kv_heads
    want = triton.cdiv(2 * num_sms, max(programs, 1))
    by_len = triton.cdiv(max_context, 256)
    return max(1, min(want, by_len, 32))


def launch_paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    max_query_len: int,
    num_splits: int | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    batch_invariant: bool = False,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Launch the kernels; inputs are already validated. No host sync.

    ``sliding_window`` is a runtime argument of one compiled variant (any window, any layer);
    ``softcap`` likewise. Split-K cuts only the keys a query tile may see.

    ``batch_invariant``: the unified kernel for every step (decode steps too) with tile sizes,
    warps and stages that depend on the dtype and head size only, and no split-K: each query
    row then meets the same key tiles in the same order, and its dots the same tile shapes,
    whatever else the step holds (a fully masked tile leaves a row's state unchanged exactly).
    """
    num_tokens, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    num_seqs = seq_lens.shape[0]
    group = num_q_heads // num_kv_heads
    g_pad = triton.next_power_of_2(group)
    # Dot mode: 0 = bf16/fp16 tensor cores; 1 = fp32 operands, exact (the CPU interpreter,
    # which cannot run bf16/fp16 dots: operands are upcast after the same rounding as on the
    # GPU); 2 = fp32 inputs on the GPU, 3xTF32 (tensor cores, about fp32 accuracy).
    dot_mode = 1 if q.device.type != "cuda" else (2 if q.dtype == torch.float32 else 0)
    scale_log2 = float(scale) * math.log2(math.e)
    cap_log2 = 0.0
    if softcap is not None:
        scale_log2 = float(scale) / softcap  # natural units until the cap
        cap_log2 = softcap * math.log2(math.e)
    # Defaults from the sweep of paged_attention_bench on an H200 (bf16, Hq=32, Hkv=8, D=128):
    # decode BLOCK_N=64, 4 warps, 2 stages; prefill BLOCK_M=64, BLOCK_N=64, 4 warps, 2 stages.
    default_bn = 64 if (head_dim <= 128 and dot_mode != 2) else 32
    if batch_invariant:
        num_splits = 1
        bm = max(32 if dot_mode == 2 else 64, g_pad)
        bq = bm // g_pad
        bn = default_bn
        warps, stages = 4, 2
        grid = (num_tokens // bq + num_seqs, num_kv_heads, 1)
    elif max_query_len <= 1:
        bm = max(16, g_pad)
        bq = 1
        bn = block_n or default_bn
        if num_splits is None:
            max_context = block_tables.shape[1] * block_size
            num_splits = decode_num_splits(num_seqs, num_kv_heads, max_context, _num_sms(q.device))
        warps = num_warps or 4
        stages = num_stages or 2
        grid = (num_seqs, num_kv_heads, num_splits)
    else:
        num_splits = 1
        if block_m is None:
            want = 32 if dot_mode == 2 else 64  # fp32 tiles: larger ones spill registers
            bm = max(16, min(want, triton.next_power_of_2(max_query_len * g_pad)), g_pad)
        else:
            bm = max(block_m, g_pad)
        bq = bm // g_pad
        bn = block_n or default_bn
        warps = num_warps or (8 if bm >= 128 else 4)
        stages = num_stages or 2
        grid = (num_tokens // bq + num_seqs, num_kv_heads, 1)
    split = num_splits > 1
    if split:
        ws_acc = torch.empty(
            (num_seqs, num_q_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
        )  # unnormalised partial outputs
        ws_ml = torch.empty(
            (num_seqs, num_q_heads, num_splits, 2), dtype=torch.float32, device=q.device
        )  # (running max in log2 units, running sum)
    else:
        ws_acc = ws_ml = out  # unused
    _paged_attn_kernel[grid](
        q, k_cache, v_cache, out, block_tables, seq_lens, query_start_loc, ws_acc, ws_ml,
        scale_log2, cap_log2, sliding_window or 0, num_seqs,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        out.stride(0), out.stride(1),
        block_tables.stride(0),
        NUM_Q_HEADS=num_q_heads, GROUP=group, G_PAD=g_pad, BLOCK_Q=bq, BLOCK_M=bm,
        BLOCK_N=bn, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        DECODE=max_query_len <= 1 and not batch_invariant, SPLIT=split, DOT_MODE=dot_mode,
        HAS_WINDOW=sliding_window is not None, SOFTCAP=softcap is not None,
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    if split:
        _combine_splits_kernel[(num_seqs, num_q_heads)](
            out, query_start_loc, ws_acc, ws_ml, num_splits, out.stride(0), out.stride(1),
            NUM_Q_HEADS=num_q_heads, S_PAD=triton.next_power_of_2(num_splits),
            HEAD_DIM=head_dim, num_warps=4,
        )  # fmt: skip
    return out


def launch_write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Launch the cache write; inputs are already validated. No host sync."""
    num_tokens, num_kv_heads, head_dim = k.shape
    _write_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        NUM_KV_HEADS=num_kv_heads, H_PAD=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM=head_dim, D_PAD=triton.next_power_of_2(head_dim), num_warps=1,
    )  # fmt: skip
