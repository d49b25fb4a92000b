"""Output slices of a fused projection (q/k/v, gate/up) as expand programs.

An expand launch covers every slice of a projection: its program index along the output
runs over the slices' column tiles one slice after another, so slices of different widths
share one grid. Used by both kernel families (``lora_bgmv`` and ``lora_sgmv``).
"""

from __future__ import annotations

from itertools import pairwise

import triton
import triton.language as tl

# Fused projections in our models have at most 3 slices (q/k/v); the kernels take 4.
MAX_SLICES = 4


@triton.jit
def slice_of(n_prog, c1, c2, c3, off0, off1, off2, off3, off4, BLOCK_N: tl.constexpr):
    """Program index within a token block -> (slice, first column, slice end).

    ``c1..c3`` are the cumulative program counts of slices 0..2, ``off*`` the offsets.
    """
    s = (n_prog >= c1).to(tl.int32) + (n_prog >= c2).to(tl.int32) + (n_prog >= c3).to(tl.int32)
    first = tl.where(s == 0, 0, tl.where(s == 1, c1, tl.where(s == 2, c2, c3)))
    lo = tl.where(s == 0, off0, tl.where(s == 1, off1, tl.where(s == 2, off2, off3)))
    hi = tl.where(s == 0, off1, tl.where(s == 1, off2, tl.where(s == 2, off3, off4)))
    return s, lo + (n_prog - first) * BLOCK_N, hi


def slice_programs(slice_offsets: tuple[int, ...], block_n: int) -> tuple[list[int], int]:
    """Cumulative program counts c1..c3 per slice (padded) and the total per token block."""
    counts = [triton.cdiv(b - a, block_n) for a, b in pairwise(slice_offsets)]
    cum = []
    total = 0
    for c in counts:
        total += c
        cum.append(total)
    cum = cum[:-1] + [total] * (MAX_SLICES - len(counts))
    return cum[: MAX_SLICES - 1], total


def padded_offsets(slice_offsets: tuple[int, ...]) -> list[int]:
    return list(slice_offsets) + [slice_offsets[-1]] * (MAX_SLICES + 1 - len(slice_offsets))
