"""Float64 references of the LoRA term, for tests and benchmark checks."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["reference_lora", "reference_shrink"]


def reference_shrink(x: torch.Tensor, lora_a: torch.Tensor, slot_ids: torch.Tensor) -> torch.Tensor:
    """Float64 shrink for tests: ``[S, T, R]``, zero rows for slot -1."""
    num_slices, max_rank = lora_a.shape[1], lora_a.shape[2]
    out = torch.zeros(num_slices, x.shape[0], max_rank, dtype=torch.float64, device=x.device)
    for slot in slot_ids.unique().tolist():
        if slot < 0:
            continue
        rows = (slot_ids == slot).nonzero().flatten()  # [n]
        a = lora_a[slot].double()  # [S, R, K]
        out[:, rows] = torch.matmul(x[rows].double(), a.transpose(1, 2))  # [S, n, R]
    return out


def reference_lora(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    slot_ids: torch.Tensor,
    slice_offsets: Sequence[int],
    token_scales: torch.Tensor | None = None,
) -> torch.Tensor:
    """Float64 ``y + token_scales[t] * LoRA(x)[t]`` for tests (returns a new float64 tensor; y is
    unchanged). ``token_scales`` ``[T]``: each token's adapter strength; None: 1.0."""
    out = y.double().clone()  # [T, out_total]
    h = reference_shrink(x, lora_a, slot_ids)  # [S, T, R]
    if token_scales is not None:
        h = h * token_scales.double()[:, None]  # [S, T, R] times [T, 1]
    for slot in slot_ids.unique().tolist():
        if slot < 0:
            continue
        rows = (slot_ids == slot).nonzero().flatten()  # [n]
        b = lora_b[slot].double()  # [out_total, R]
        for s in range(len(slice_offsets) - 1):
            lo, hi = slice_offsets[s], slice_offsets[s + 1]
            out[rows, lo:hi] += h[s, rows] @ b[lo:hi].T
    return out
