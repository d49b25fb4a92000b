"""SiLU-and-mul with the gate/up projection's LoRA expand folded in: one launch instead of two.

With the shrink in GEMM (``lora.lora_expand_shrunk_in_gemm``), the gate/up GEMM's
output is the base ``[T, 2 I]`` plus every slot's shrink ``[T, slots, 2, R]``. Its only
reader is SiLU-and-mul, so the expand is done there: each program loads its token's B rows
for one block of gate columns and the matching up columns, adds the LoRA term to gate and
up in registers (rounded to the model dtype exactly as the expand rounds y), and writes
``silu(gate) * up``. The ``[T, 2 I]`` output is never rewritten and read back, and the
expand's launch is gone.
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
def _silu_mul_lora_kernel(
    gu_ptr,
    shrunk_ptr,
    b_ptr,
    out_ptr,
    slots_ptr,
    ranks_ptr,
    scales_ptr,
    row_scale_ptr,
    row_bias_ptr,
    stride_row,
    n_cols,
    stride_gt,
    stride_st,
    stride_sl,
    stride_ss,
    stride_sr,
    stride_wl,
    stride_wn,
    stride_wr,
    stride_ot,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    RANK_ALIGN: tl.constexpr,
    HAS_ROW_SCALE: tl.constexpr,
    HAS_ROW_BIAS: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """out[t, j] = silu(gate[t, j] + lora_gate) * (up[t, j] + lora_up) for one block of j, with
    the slot's row terms (``lora_rows``) after each LoRA term."""
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    ok = cols < n_cols
    slot = tl.load(slots_ptr + t)
    rank = tl.load(ranks_ptr + t)  # 0 for tokens without an adapter
    scale = tl.load(scales_ptr + t)  # the token's adapter strength, float32
    offs_r = tl.arange(0, BLOCK_R)  # [BR]
    # B rows of the gate columns, then of the up columns (n_cols further): weights first.
    w_gate = load_token_b(b_ptr, slot, rank, cols, ok, offs_r, stride_wl, stride_wn, stride_wr, RANK_ALIGN)
    w_up = load_token_b(
        b_ptr, slot, rank, n_cols + cols, ok, offs_r, stride_wl, stride_wn, stride_wr, RANK_ALIGN
    )
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    row = gu_ptr + t.to(tl.int64) * stride_gt
    gate = tl.load(row + cols, mask=ok, other=0.0)  # [BN], model dtype
    up = tl.load(row + n_cols + cols, mask=ok, other=0.0)
    if rank > 0:
        h_ptrs = shrunk_ptr + t.to(tl.int64) * stride_st + slot.to(tl.int64) * stride_sl + offs_r * stride_sr
        gate = add_token_lora(gate, w_gate, h_ptrs, rank, offs_r, scale)
        up = add_token_lora(up, w_up, h_ptrs + stride_ss, rank, offs_r, scale)
        if HAS_ROW_SCALE or HAS_ROW_BIAS:
            gate = add_row_terms(
                gate,
                row_scale_ptr,
                row_bias_ptr,
                stride_row,
                slot,
                cols,
                ok,
                scale,
                HAS_ROW_SCALE,
                HAS_ROW_BIAS,
            )
            up = add_row_terms(
                up, row_scale_ptr, row_bias_ptr, stride_row, slot, n_cols + cols, ok, scale, HAS_ROW_SCALE,
                HAS_ROW_BIAS,
            )  # fmt: skip
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(up.dtype).to(tl.float32)  # rounded like F.silu's output
    tl.store(out_ptr + t.to(tl.int64) * stride_ot + cols, (act * up.to(tl.float32)).to(up.dtype), mask=ok)


def launch(
    gate_up: torch.Tensor,
    shrunk: torch.Tensor,
    lora_b: torch.Tensor,
    batch: LoRABatch,
    plan: LoRAPlan,
    rows: RowTerms | None = None,
) -> torch.Tensor:
    """Launch the kernel (``lora.silu_and_mul_lora`` has the semantics); returns ``[T, I]``.

    ``gate_up`` ``[T, 2 I]`` with a contiguous last dim; tiles and launch options from ``plan``.
    """
    num_tokens, width = gate_up.shape
    half = width // 2
    check_shrunk_in_gemm(num_tokens, width, gate_up.dtype, shrunk, lora_b, slices=2)
    row_args = row_kernel_args(rows, width, gate_up.dtype, lora_b.shape[0], gate_up)
    out = torch.empty((num_tokens, half), dtype=gate_up.dtype, device=gate_up.device)  # [T, I]
    if num_tokens == 0:
        return out
    br = block_r(lora_b.shape[-1])
    bn = max(16, plan.bgmv_expand_tile // (2 * br))
    st_t, st_l, st_s, st_r = shrunk.stride()
    _silu_mul_lora_kernel[(num_tokens, triton.cdiv(half, bn))](
        gate_up,
        shrunk,
        lora_b,
        out,
        batch.token_slots,
        batch.token_ranks,
        batch.token_scales,
        *row_args,
        half,
        gate_up.stride(0),
        st_t,
        st_l,
        st_s,
        st_r,
        *lora_b.stride(),
        out.stride(0),
        BLOCK_N=bn,
        BLOCK_R=br,
        RANK_ALIGN=rank_align(lora_b),
        **row_flags(rows),
        **launch_options(plan.pdl, plan.bgmv_expand_warps),
    )
    return out
