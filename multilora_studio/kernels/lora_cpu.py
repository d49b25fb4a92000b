"""Multi-LoRA ``y += B[slot] @ (A[slot] @ x)`` for float32 batches on the CPU, compiled by Numba.

The torch backend spends its time in per-operation overhead at decode sizes (about 11 small
operations per projection group, 50-130 us each call at 8 tokens on two cores). This kernel
walks the tokens once: for each token, its adapter's shrink (``rank`` dot products over
``in_features``) then, per slice, ``rank`` axpys into the token's output row. It is
single-threaded, does not hold the GIL, and is used for float32 batches of up to
``LoRAPlan.numba_max_tokens`` tokens; larger batches (prefill) keep the torch ops' grouped GEMMs.

The expand is fastest when ``lora_b`` is a transposed view of ``[slots, R, out_total]``
storage (``lora_b.stride(1) == 1``), as the engine's CPU slot buffers are; any other
layout is handled too, through Numba's strided arrays.

Numba is optional: :data:`AVAILABLE` is False when it cannot be imported, and
``LoRAPlan.for_device`` picks the torch ops.
"""

from __future__ import annotations

import functools
import logging
import time

import numpy as np
import torch

try:
    import numba
except ImportError:  # pragma: no cover - numba is a dependency; a broken install falls back to torch
    numba = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

AVAILABLE = numba is not None
# Reassociation (vectorised sums) without the flags that assume no inf/NaN or approximate maths.
FASTMATH = {"reassoc", "contract", "nsz", "arcp"}


def _add_lora_rows(y, x, a, bt, token_slots, token_ranks, sorted_tokens, token_scales, offsets):
    """Numba body. Shapes: y [T, N], x [T, K], a [G, S, R, K], bt [G, R, N], offsets [S + 1].

    token_slots / token_ranks [>= T]: slot and rank of each token (-1 / 0: no adapter);
    token_scales [>= T] float32: each token's strength, multiplied into its shrink (exact for 1.0);
    sorted_tokens: token indices grouped by slot (entries >= T are skipped).
    Slices index with ranges from 0 (never a possibly negative index), so loops vectorise.
    """
    num_tokens = x.shape[0]
    num_slices = a.shape[1]
    h = np.empty(a.shape[2], np.float32)  # [R]: one slice's shrink for one token
    for i in range(sorted_tokens.shape[0]):
        t = sorted_tokens[i]  # tokens of one adapter in a row: its factors stay in cache
        if t >= num_tokens:
            continue
        slot = token_slots[t]
        rank = token_ranks[t]
        if slot < 0 or rank <= 0:
            continue
        scale = token_scales[t]
        x_row = x[t]  # [K]
        y_row = y[t]  # [N]
        for s in range(num_slices):
            for r in range(rank):
                a_row = a[slot, s, r]  # [K]
                acc = np.float32(0.0)
                for k in range(x_row.shape[0]):
                    acc += x_row[k] * a_row[k]
                h[r] = acc * scale
            y_slice = y_row[offsets[s] : offsets[s + 1]]  # [n_s]
            for r in range(rank):
                h_r = h[r]
                b_row = bt[slot, r, offsets[s] : offsets[s + 1]]  # [n_s]
                for j in range(y_slice.shape[0]):
                    y_slice[j] += h_r * b_row[j]


_kernel = numba.njit(fastmath=FASTMATH, nogil=True, cache=True)(_add_lora_rows) if AVAILABLE else None


@functools.lru_cache(maxsize=64)
def _offsets_array(offsets: tuple[int, ...]) -> np.ndarray:
    return np.asarray(offsets, dtype=np.int64)


def add_lora_cpu(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    token_arrays: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    slice_offsets: tuple[int, ...],
) -> None:
    """``y[t, lo_s:hi_s] += scale_t * (x[t] @ A[slot_t, s, :rank_t].T) @ B[slot_t, lo_s:hi_s, :rank_t].T``.

    Shapes: y [T, out_total] and x [T, K] float32; lora_a [slots, S, R, K];
    lora_b [slots, out_total, R]; ``token_arrays`` = (token_slots, token_ranks, sorted_tokens,
    token_scales), int32 (float32 for the scales) numpy views [>= T] of the batch's buffers
    (``LoRABatch.host_arrays``; slot -1 or rank 0 leaves the row untouched). No checks: the
    caller's tensors are consistent (``add_lora`` checks them when asked to).
    """
    assert _kernel is not None  # a plan with backend "numba" needs AVAILABLE
    token_slots, token_ranks, sorted_tokens, token_scales = token_arrays
    _kernel(
        y.numpy(),
        x.numpy(),
        lora_a.numpy(),
        lora_b.numpy().transpose(0, 2, 1),  # [slots, R, out_total]
        token_slots,
        token_ranks,
        sorted_tokens,
        token_scales,
        _offsets_array(slice_offsets),
    )


def compile_now() -> float:
    """Compile (or load from Numba's cache) the kernel for the engine's argument types.

    Returns the seconds it took; the engine calls it at start-up so the first LoRA step
    does not pay for it.
    """
    if not AVAILABLE:
        return 0.0
    start = time.perf_counter()
    y = torch.zeros(1, 2)
    b = torch.zeros(1, 1, 2).transpose(1, 2)  # [slots, out_total, R] over [slots, R, out_total]
    slots = np.zeros(1, dtype=np.int32)
    scales = np.ones(1, dtype=np.float32)
    add_lora_cpu(y, torch.zeros(1, 2), torch.zeros(1, 1, 1, 2), b, (slots, slots, slots, scales), (0, 2))
    elapsed = time.perf_counter() - start
    log.debug("CPU LoRA kernel ready in %.2f s", elapsed)
    return elapsed
