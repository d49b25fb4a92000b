"""What follows the q/k/v GEMM, in one launch: LoRA expand, q/k norms, RoPE on q and k, K/V to the cache.

The q/k/v GEMM's output is read by RoPE (q and k, in place) and by the cache write (k and
v); with the shrink in GEMM (``lora.lora_expand_shrunk_in_gemm``) the LoRA expand comes first.
Program ``(t, head)`` takes one head of q, k or v of token ``t``: it loads the token's B rows
for that head (the weights first, before waiting on the GEMM), adds the LoRA term (rounded
as the expand rounds), normalises q and k heads where the model has q/k norms (Qwen3,
``head_rms_norm_``), rotates q and k heads as ``rope_`` does, and stores q back in place
and k / v into their cache slot (none for padding tokens, slot -1). Three launches (four
with LoRA, six with q/k norms) become one; the results are equal bit for bit to those
launches, but for the norms' sum of squares (over the two halves of the head, then added).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .lora_batch import LoRABatch
from .lora_bgmv import add_token_lora, block_r, load_token_b, rank_align
from .lora_checks import check_shrunk_in_gemm
from .lora_plan import LoRAPlan
from .lora_rows import RowTerms, add_row_terms, row_flags, row_kernel_args
from .triton_support import gdc_launch_dependents, gdc_wait, launch_options


@triton.jit
def _qkv_epilogue_kernel(
    qkv_ptr,
    cs_ptr,
    pos_ptr,
    slot_map_ptr,
    k_cache_ptr,
    v_cache_ptr,
    shrunk_ptr,
    b_ptr,
    slots_ptr,
    ranks_ptr,
    scales_ptr,
    row_scale_ptr,
    row_bias_ptr,
    stride_row,
    q_norm_ptr,
    k_norm_ptr,
    eps,
    num_q_heads,
    num_kv_heads,
    stride_qt,
    stride_cs,
    stride_cache_slot,
    stride_cache_head,
    stride_st,
    stride_sl,
    stride_ss,
    stride_sr,
    stride_bl,
    stride_bn,
    stride_br,
    HALF: tl.constexpr,
    BLOCK_R: tl.constexpr,
    RANK_ALIGN: tl.constexpr,
    HAS_LORA: tl.constexpr,
    HAS_QK_NORM: tl.constexpr,
    HAS_ROW_SCALE: tl.constexpr,
    HAS_ROW_BIAS: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    t = tl.program_id(0)
    head = tl.program_id(1)  # q heads, then k heads, then v heads
    col0 = head * (2 * HALF)  # the head's first column in the q/k/v row
    d = tl.arange(0, HALF)  # [HALF]
    offs_r = tl.arange(0, BLOCK_R)  # [BR]
    if HAS_LORA:
        slot = tl.load(slots_ptr + t)
        rank = tl.load(ranks_ptr + t)  # 0 for tokens without an adapter
        scale = tl.load(scales_ptr + t)  # the token's adapter strength, float32
        whole = d < HALF
        # the token's B rows of both halves of this head, before waiting on the GEMM
        w1 = load_token_b(
            b_ptr, slot, rank, col0 + d, whole, offs_r, stride_bl, stride_bn, stride_br, RANK_ALIGN
        )
        w2 = load_token_b(
            b_ptr, slot, rank, col0 + HALF + d, whole, offs_r, stride_bl, stride_bn, stride_br, RANK_ALIGN
        )
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    row = qkv_ptr + t.to(tl.int64) * stride_qt + col0
    x1 = tl.load(row + d)  # [HALF], model dtype
    x2 = tl.load(row + HALF + d)
    if HAS_LORA:  # noqa: SIM102 (a compile-time branch: rank exists only with LoRA)
        if rank > 0:
            part = (head >= num_q_heads).to(tl.int32) + (head >= num_q_heads + num_kv_heads).to(tl.int32)
            h_ptrs = (
                shrunk_ptr
                + t.to(tl.int64) * stride_st
                + slot.to(tl.int64) * stride_sl
                + part * stride_ss
                + offs_r * stride_sr
            )
            x1 = add_token_lora(x1, w1, h_ptrs, rank, offs_r, scale)
            x2 = add_token_lora(x2, w2, h_ptrs, rank, offs_r, scale)
            if HAS_ROW_SCALE or HAS_ROW_BIAS:
                x1 = add_row_terms(
                    x1, row_scale_ptr, row_bias_ptr, stride_row, slot, col0 + d, whole, scale, HAS_ROW_SCALE,
                    HAS_ROW_BIAS,
                )  # fmt: skip
                x2 = add_row_terms(
                    x2, row_scale_ptr, row_bias_ptr, stride_row, slot, col0 + HALF + d, whole, scale,
                    HAS_ROW_SCALE, HAS_ROW_BIAS,
                )  # fmt: skip
    if HAS_QK_NORM:  # noqa: SIM102 (a compile-time branch)
        if head < num_q_heads + num_kv_heads:  # q and k: RMSNorm over the head, as rms_norm rounds
            norm_ptr = q_norm_ptr
            if head >= num_q_heads:
                norm_ptr = k_norm_ptr
            n1, n2 = x1.to(tl.float32), x2.to(tl.float32)  # [HALF] each
            inv = tl.rsqrt((tl.sum(n1 * n1, axis=0) + tl.sum(n2 * n2, axis=0)) / (2 * HALF) + eps)
            w1n = tl.load(norm_ptr + d).to(tl.float32)
            w2n = tl.load(norm_ptr + HALF + d).to(tl.float32)
            x1 = (w1n * (n1 * inv).to(x1.dtype).to(tl.float32)).to(x1.dtype)
            x2 = (w2n * (n2 * inv).to(x2.dtype).to(tl.float32)).to(x2.dtype)
    if head < num_q_heads + num_kv_heads:  # q and k: rotate half, as rope_
        pos = tl.load(pos_ptr + t)
        cos = tl.load(cs_ptr + pos * stride_cs + d)
        sin = tl.load(cs_ptr + pos * stride_cs + HALF + d)
        f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
        x1, x2 = (f1 * cos - f2 * sin).to(x1.dtype), (f2 * cos + f1 * sin).to(x2.dtype)
    if head < num_q_heads:
        tl.store(row + d, x1)
        tl.store(row + HALF + d, x2)
    else:
        dst = tl.load(slot_map_ptr + t)  # -1: a padding token, nothing written
        if dst >= 0:
            kv_head = head - num_q_heads
            cache_ptr = k_cache_ptr
            if kv_head >= num_kv_heads:
                kv_head -= num_kv_heads
                cache_ptr = v_cache_ptr
            out = cache_ptr + dst * stride_cache_slot + kv_head * stride_cache_head
            tl.store(out + d, x1)
            tl.store(out + HALF + d, x2)


def launch(
    qkv: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    cos_sin: torch.Tensor,
    positions: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    lora: tuple[torch.Tensor, torch.Tensor, LoRABatch] | None,
    plan: LoRAPlan,
    qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None,
    rows: RowTerms | None = None,
) -> torch.Tensor:
    """Launch the kernel (``lora.qkv_rope_write`` has the semantics); returns q ``[T, Hq, D]``.

    ``qkv`` ``[T, (Hq + 2 Hkv) * D]`` with a contiguous last dim; head_dim a power of two >= 8
    and LoRA ranks up to ``FOLDED_EXPAND_MAX_RANK``. Launch options from ``plan``.
    """
    num_tokens, width = qkv.shape
    head_dim = cos_sin.shape[1]
    heads = num_q_heads + 2 * num_kv_heads
    q = qkv[:, : num_q_heads * head_dim].view(num_tokens, num_q_heads, head_dim)
    if cos_sin.dtype != torch.float32 or positions.shape != (num_tokens,):
        raise ValueError("cos_sin must be float32 [positions, head_dim] and positions [T]")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()) or k_cache.shape[2:] != (
        num_kv_heads,
        head_dim,
    ):
        raise ValueError(
            f"k_cache/v_cache must be contiguous [blocks, block_size, {num_kv_heads}, {head_dim}]"
        )
    if slot_mapping.dtype != torch.int64 or slot_mapping.shape != (num_tokens,):
        raise ValueError(f"slot_mapping must be int64 [{num_tokens}]")
    if num_tokens == 0:
        return q
    if qk_norm is not None:
        q_norm, k_norm, eps = qk_norm
        if q_norm.shape != (head_dim,) or k_norm.shape != (head_dim,):
            raise ValueError(f"q/k norm weights must be [{head_dim}]")
        norm_args: tuple[torch.Tensor, torch.Tensor, float] = (q_norm, k_norm, float(eps))
    else:
        norm_args = (cos_sin, cos_sin, 0.0)  # never read
    if lora is not None:
        shrunk, lora_b, batch = lora
        check_shrunk_in_gemm(num_tokens, width, qkv.dtype, shrunk, lora_b, slices=3)
        row_args = row_kernel_args(rows, width, qkv.dtype, lora_b.shape[0], qkv)
        lora_args = (shrunk, lora_b, batch.token_slots, batch.token_ranks, batch.token_scales, *row_args)
        shrunk_strides = (shrunk.stride(0), shrunk.stride(1), shrunk.stride(2), shrunk.stride(3))
        b_strides = lora_b.stride()
        br, align = block_r(lora_b.shape[-1]), rank_align(lora_b)
    else:
        if rows is not None:
            raise ValueError("row terms come with a LoRA term")
        lora_args = (qkv, qkv, slot_mapping, slot_mapping, cos_sin, qkv, qkv, 0)  # never read
        shrunk_strides, b_strides, br, align = (0, 0, 0, 0), (0, 0, 0), 8, 1
    _qkv_epilogue_kernel[(num_tokens, heads)](
        qkv,
        cos_sin,
        positions,
        slot_mapping,
        k_cache,
        v_cache,
        *lora_args,
        *norm_args,
        num_q_heads,
        num_kv_heads,
        qkv.stride(0),
        cos_sin.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        *shrunk_strides,
        *b_strides,
        HALF=head_dim // 2,
        BLOCK_R=br,
        RANK_ALIGN=align,
        HAS_LORA=lora is not None,
        HAS_QK_NORM=qk_norm is not None,
        **row_flags(rows),
        **launch_options(plan.pdl, 1),
    )
    return q
