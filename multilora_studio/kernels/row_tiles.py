"""GEMMs at one fixed row count, so each output row is the same bits whatever the batch holds.

A GEMM library picks its kernel, blocking and K-splitting from the problem's shape: on the CPU
``F.linear`` in float32 takes a matrix-vector kernel for one row and other blockings from 2 and
from 4 rows, and the rows it returns differ in their last bits (docs/BENCHMARKS.md, "Batch
invariance"). Computing every row in tiles of exactly ``tile`` rows (the last one padded with
zero rows) gives each row one arithmetic: that of a ``tile``-row GEMM of the same weight.
``LoRAPlan.gemm_row_tile`` sets the tile; the engine uses it in batch-invariant mode only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["Linear", "row_tiled"]

Linear = Callable[..., torch.Tensor]  # (x [T, K], weight, bias=None) -> [T, N]


def row_tiled(
    linear: Linear, tile: int, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``linear(x, weight, bias)`` [T, N] computed ``tile`` rows per call.

    Semantics: ``linear(x, weight, bias)``; row t of the result depends only on ``x[t]``,
    ``weight``, ``bias`` and ``tile``, never on T or the other rows. Each tile is passed
    contiguous, so a strided ``x`` meets the same kernel as a contiguous one.
    """
    rows = x.shape[0]
    whole = rows - rows % tile
    parts = [linear(x[start : start + tile].contiguous(), weight, bias) for start in range(0, whole, tile)]
    if whole < rows:
        padded = x.new_zeros((tile, x.shape[1]))  # [tile, K]: the last rows, then zeros
        padded[: rows - whole] = x[whole:]
        parts.append(linear(padded, weight, bias)[: rows - whole])
    if not parts:
        return linear(x, weight, bias)  # no rows: the [0, N] result
    return parts[0] if len(parts) == 1 else torch.cat(parts)
