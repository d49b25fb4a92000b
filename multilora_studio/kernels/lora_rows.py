"""Per-row output terms of DoRA and lora_bias adapters, for the kernels that fold an expand.

A DoRA adapter scales each output row of an adapted projection by ``magnitude / ||W + B A||``
and a lora_bias adapter adds a bias on the B side. Both are per-slot data ``[slots + 1, N]``
of one layer and projection group (the last row, for tokens without an adapter, holds 1 and
0). For each token with an adapter (a slot of rank > 0, as the LoRA kernels count it), after its
LoRA term:

    y = y * scale[slot]                      (rounded to y's dtype)
    y = y + strength * bias[slot]            (strength rounded to y's dtype, the product, then the sum)

which is what the unfolded path computes with torch ops (``apply_row_terms``), so the folded
and unfolded results are equal bit for bit. Tokens without an adapter are left untouched.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .lora_batch import LoRABatch


class RowTerms(NamedTuple):
    """One layer's per-row terms of one projection group: ``scale`` and ``bias``, each
    ``[slots + 1, N]`` in y's dtype, or None where no adapter of the engine has that kind."""

    scale: torch.Tensor | None
    bias: torch.Tensor | None

    def check(self, width: int, dtype: torch.dtype, num_slots: int) -> None:
        """ValueError unless each is ``[>= num_slots + 1, width]`` (a step may use the leading
        ``num_slots`` slots of more) in ``dtype`` with a contiguous last dim."""
        for name, rows in (("scale", self.scale), ("bias", self.bias)):
            if rows is None:
                continue
            wrong = rows.dim() != 2 or rows.shape[0] < num_slots + 1 or rows.shape[1] != width
            if wrong or rows.dtype != dtype or rows.stride(1) != 1:
                raise ValueError(
                    f"row {name} must be [>= {num_slots + 1}, {width}] {dtype} with a contiguous last dim, "
                    f"got {tuple(rows.shape)} {rows.dtype}"
                )

    def kernel_args(self, fallback: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        """``(scale, bias, row stride)`` for a kernel; ``fallback`` stands for a missing one (never read)."""
        scale = fallback if self.scale is None else self.scale
        bias = fallback if self.bias is None else self.bias
        present = self.scale if self.scale is not None else self.bias
        return scale, bias, 0 if present is None else present.stride(0)


def row_kernel_args(
    rows: RowTerms | None, width: int, dtype: torch.dtype, num_slots: int, fallback: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(scale, bias, row stride)`` of ``rows`` for a folding kernel, checked against the
    launch (``width`` columns, ``dtype``, ``num_slots`` slots); ``fallback`` stands for a missing one."""
    terms = RowTerms(None, None) if rows is None else rows
    terms.check(width, dtype, num_slots)
    return terms.kernel_args(fallback)


def apply_row_terms(
    y: torch.Tensor, rows: RowTerms, batch: LoRABatch, base_bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``y`` [T, N] with each adapted token's row terms (see the module docstring); ``base_bias``
    [N]: the projection's own bias, already in ``y`` and kept outside DoRA's scale."""
    num_tokens = y.shape[0]
    slots = batch.token_slots[:num_tokens]
    index = torch.where(slots < 0, batch.num_slots, slots).long()  # [T], the last row: 1 and 0
    out = y
    if rows.scale is not None:
        scale = rows.scale[index]  # [T, N]
        out = scale * out if base_bias is None else scale * (out - base_bias) + base_bias
    if rows.bias is not None:
        strength = batch.token_scales[:num_tokens, None].to(y.dtype)  # [T, 1]
        out = out + strength * rows.bias[index]
    adapted = batch.token_ranks[:num_tokens] > 0  # [T]
    return torch.where(adapted[:, None], out, y)  # rows without an adapter: y, bit for bit


@triton.jit
def add_row_terms(
    y,
    scale_ptr,
    bias_ptr,
    stride_row,
    slot,
    cols,
    ok,
    strength,
    HAS_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """``y`` [BN] (columns ``cols`` of a token with an adapter in ``slot``) with its row terms,
    rounded as ``apply_row_terms`` rounds (with both terms, a GPU compiler may fuse the scale's
    product into the bias's sum, skipping one rounding to the dtype)."""
    row = slot.to(tl.int64) * stride_row + cols
    if HAS_SCALE:
        scale = tl.load(scale_ptr + row, mask=ok, other=1.0)
        y = (y.to(tl.float32) * scale.to(tl.float32)).to(y.dtype)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + row, mask=ok, other=0.0)
        shift = (strength.to(y.dtype).to(tl.float32) * bias.to(tl.float32)).to(y.dtype)
        y = (y.to(tl.float32) + shift.to(tl.float32)).to(y.dtype)
    return y


def row_flags(rows: RowTerms | None) -> dict[str, bool]:
    """The kernels' HAS_SCALE / HAS_BIAS compile-time flags for ``rows``."""
    return {
        "HAS_ROW_SCALE": rows is not None and rows.scale is not None,
        "HAS_ROW_BIAS": rows is not None and rows.bias is not None,
    }
