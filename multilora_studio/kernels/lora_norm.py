"""Residual-add + RMSNorm with the o / down projection's LoRA expand folded in: one launch, not two.

With the shrink in GEMM (``lora.lora_expand_shrunk_in_gemm``), the o and down
GEMMs' outputs are read only by the residual-add + RMSNorm that follows. This kernel does
the expand there. Program ``(t, c)`` loads its token's B rows for column block ``c``,
adds the LoRA term to the projection's output and that to the residual (rounded to the
model dtype exactly as the expand and ``add_rms_norm`` round), stores the new residual
block, and increments the row's counter. The program that arrives last (the counter
read ``blocks - 1``) reads the whole new residual row back, normalises it as
``add_rms_norm`` does and resets the counter to zero for the next launch. No program waits
on another, so any launch order is safe. The new residual is equal bit for bit to the two
launches'; the normalised row is too under the interpreter, and on a GPU may differ in the
last bit (the row's sum runs over another number of warps than ``add_rms_norm``'s).
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
def _add_rms_norm_lora_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    shrunk_ptr,
    b_ptr,
    slots_ptr,
    ranks_ptr,
    scales_ptr,
    row_scale_ptr,
    row_bias_ptr,
    stride_row,
    counter_ptr,
    n_cols,
    num_blocks,
    eps,
    stride_xt,
    stride_rt,
    stride_ot,
    stride_st,
    stride_sl,
    stride_sr,
    stride_bl,
    stride_bn,
    stride_br,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    ROW_BLOCK: tl.constexpr,
    RANK_ALIGN: tl.constexpr,
    HAS_ROW_SCALE: tl.constexpr,
    HAS_ROW_BIAS: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    ok = cols < n_cols
    slot = tl.load(slots_ptr + t)
    rank = tl.load(ranks_ptr + t)  # 0 for tokens without an adapter
    scale = tl.load(scales_ptr + t)  # the token's adapter strength, float32
    offs_r = tl.arange(0, BLOCK_R)  # [BR]
    # the token's B rows first: they do not wait on the previous kernel
    w = load_token_b(b_ptr, slot, rank, cols, ok, offs_r, stride_bl, stride_bn, stride_br, RANK_ALIGN)
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    x = tl.load(x_ptr + t.to(tl.int64) * stride_xt + cols, mask=ok, other=0.0)  # [BN], model dtype
    if rank > 0:
        h_ptrs = shrunk_ptr + t.to(tl.int64) * stride_st + slot.to(tl.int64) * stride_sl + offs_r * stride_sr
        x = add_token_lora(x, w, h_ptrs, rank, offs_r, scale)
        if HAS_ROW_SCALE or HAS_ROW_BIAS:
            x = add_row_terms(
                x, row_scale_ptr, row_bias_ptr, stride_row, slot, cols, ok, scale, HAS_ROW_SCALE, HAS_ROW_BIAS
            )
    res_row = res_ptr + t.to(tl.int64) * stride_rt
    res = tl.load(res_row + cols, mask=ok, other=0.0)
    tl.store(res_row + cols, (x.to(tl.float32) + res.to(tl.float32)).to(res.dtype), mask=ok)
    # Release this block's residual, acquire the others'; the last block's program normalises.
    arrived = tl.atomic_add(counter_ptr + t, 1, sem="acq_rel")
    if arrived == num_blocks - 1:
        row_cols = tl.arange(0, ROW_BLOCK)
        row_ok = row_cols < n_cols
        x_raw = tl.load(res_row + row_cols, mask=row_ok, other=0.0, cache_modifier=".cg")  # [ROW_BLOCK]
        x32 = x_raw.to(tl.float32)
        var = tl.sum(x32 * x32, axis=0) / n_cols
        normed = (x32 * tl.rsqrt(var + eps)).to(x_raw.dtype).to(tl.float32)
        nw = tl.load(w_ptr + row_cols, mask=row_ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + t.to(tl.int64) * stride_ot + row_cols, (nw * normed).to(x_raw.dtype), mask=row_ok)
        tl.store(counter_ptr + t, 0)  # ready for the next launch


def launch(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    shrunk: torch.Tensor,
    lora_b: torch.Tensor,
    batch: LoRABatch,
    counters: torch.Tensor,
    plan: LoRAPlan,
    rows: RowTerms | None = None,
) -> torch.Tensor:
    """Launch the kernel (``lora.add_rms_norm_lora`` has the semantics); returns ``[T, H]``.

    Tiles and launch options from ``plan``.
    """
    num_tokens, hidden = x.shape
    if x.stride(1) != 1 or residual.stride(1) != 1 or residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError("x and residual must be [T, H] of one dtype with a contiguous last dim")
    if weight.shape != (hidden,) or weight.dtype != x.dtype:
        raise ValueError(
            f"weight must be [{hidden}] of dtype {x.dtype}, got {tuple(weight.shape)} {weight.dtype}"
        )
    check_shrunk_in_gemm(num_tokens, hidden, x.dtype, shrunk, lora_b, slices=1)
    row_args = row_kernel_args(rows, hidden, x.dtype, lora_b.shape[0], x)
    if counters.dtype != torch.int32 or counters.numel() < num_tokens or counters.device != x.device:
        raise ValueError(f"counters must be int32 zeros with at least {num_tokens} entries on {x.device}")
    out = torch.empty((num_tokens, hidden), dtype=x.dtype, device=x.device)  # [T, H]
    if num_tokens == 0:
        return out
    br = block_r(lora_b.shape[-1])
    bn = max(16, plan.bgmv_expand_tile // br)
    num_blocks = triton.cdiv(hidden, bn)
    st_t, st_l, _, st_r = shrunk.stride()
    _add_rms_norm_lora_kernel[(num_tokens, num_blocks)](
        x,
        residual,
        weight,
        out,
        shrunk,
        lora_b,
        batch.token_slots,
        batch.token_ranks,
        batch.token_scales,
        *row_args,
        counters,
        hidden,
        num_blocks,
        eps,
        x.stride(0),
        residual.stride(0),
        out.stride(0),
        st_t,
        st_l,
        st_r,
        *lora_b.stride(),
        BLOCK_N=bn,
        BLOCK_R=br,
        ROW_BLOCK=triton.next_power_of_2(hidden),
        RANK_ALIGN=rank_align(lora_b),
        **row_flags(rows),
        **launch_options(plan.pdl, plan.bgmv_expand_warps),
    )
    return out
