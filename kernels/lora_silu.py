"""SiLU-and-mul with the gate/up projection's LoRA expand folded in: one launch instead of two.

When the shrink runs inside the base GEMM (``lora_expand_gathered``), the gate/up GEMM's
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

from .fused_ops import silu_and_mul
from .lora import LoRABatch, _backend_of, lora_expand_gathered
from .lora_decode import (
    EXPAND_TILE,
    EXPAND_WARPS,
    _launch_options,
    add_token_lora,
    block_r,
    check_gathered,
    folds_expand,
    gdc_launch_dependents,
    gdc_wait,
    load_token_b,
    rank_align,
    use_pdl,
)


@triton.jit
def _silu_mul_lora_kernel(
    gu_ptr,
    shrunk_ptr,
    b_ptr,
    out_ptr,
    slots_ptr,
    ranks_ptr,
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
    USE_PDL: tl.constexpr,
):
    """out[t, j] = silu(gate[t, j] + lora_gate) * (up[t, j] + lora_up) for one block of j."""
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    ok = cols < n_cols
    slot = tl.load(slots_ptr + t)
    rank = tl.load(ranks_ptr + t)  # 0 for tokens without an adapter
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
        gate = add_token_lora(gate, w_gate, h_ptrs, rank, offs_r)
        up = add_token_lora(up, w_up, h_ptrs + stride_ss, rank, offs_r)
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(up.dtype).to(tl.float32)  # rounded like F.silu's output
    tl.store(out_ptr + t.to(tl.int64) * stride_ot + cols, (act * up.to(tl.float32)).to(up.dtype), mask=ok)


def silu_and_mul_lora(
    gate_up: torch.Tensor,
    shrunk: torch.Tensor,
    lora_b: torch.Tensor,
    batch: LoRABatch,
    backend: str = "auto",
) -> torch.Tensor:
    """``silu(gate) * up`` after adding each token's gate/up LoRA term; returns ``[T, I]``.

    Args:
        gate_up: ``[T, 2 I]`` base output of the gate/up GEMM (gate then up), last dim
            contiguous, any row stride. Left unspecified afterwards (the torch path adds the
            LoRA term into it).
        shrunk: ``[T, num_slots, 2, max_rank]``: every slot's shrink (as for
            :func:`lora_expand_gathered`), any float dtype and strides.
        lora_b: ``[num_slots, 2 I, max_rank]``, gate_up's dtype, scale folded in.
        batch: the step's :class:`LoRABatch`.
        backend: ``"auto"`` (Triton on CUDA), ``"triton"`` (also under ``TRITON_INTERPRET=1``)
            or ``"torch"``. Triton runs one launch for up to ``DECODE_MAX_TOKENS`` tokens and
            ``max_rank <= 64``; otherwise the expand and SiLU-and-mul run one after the other.

    Semantics::

        lora_expand_gathered(gate_up, shrunk, lora_b, batch, (0, I, 2 * I))
        return silu_and_mul(gate_up)
    """
    num_tokens, width = gate_up.shape
    if width % 2 or gate_up.stride(1) != 1:
        raise ValueError(f"gate_up must be [T, 2 I] with a contiguous last dim, got {tuple(gate_up.shape)}")
    half = width // 2
    offsets = (0, half, width)
    max_rank = lora_b.shape[-1]
    if not folds_expand(_backend_of(backend, gate_up.device), num_tokens, max_rank):
        lora_expand_gathered(gate_up, shrunk, lora_b, batch, offsets, backend=backend)
        return silu_and_mul(gate_up, backend=backend)
    check_gathered(num_tokens, width, gate_up.dtype, shrunk, lora_b, slices=2)
    out = torch.empty((num_tokens, half), dtype=gate_up.dtype, device=gate_up.device)  # [T, I]
    if num_tokens == 0:
        return out
    br = block_r(max_rank)
    bn = max(16, EXPAND_TILE // (2 * br))
    st_t, st_l, st_s, st_r = shrunk.stride()
    _silu_mul_lora_kernel[(num_tokens, triton.cdiv(half, bn))](
        gate_up,
        shrunk,
        lora_b,
        out,
        batch.token_slots,
        batch.token_ranks,
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
        **_launch_options(use_pdl(gate_up.device), EXPAND_WARPS),
    )
    return out
