"""Argument checks of the LoRA wrappers (:mod:`multilora_studio.kernels.lora`): ValueError
with a message that names the argument, for shapes, dtypes, devices, slot counts, ranks,
slice offsets and strides."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import torch

from .lora_batch import LoRABatch
from .lora_slices import MAX_SLICES

__all__ = [
    "check_b",
    "check_device",
    "check_expand",
    "check_float",
    "check_offsets",
    "check_shrink",
    "check_shrunk_in_gemm",
]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_float(name: str, t: object, dim: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dim:
        raise ValueError(f"{name} must have {dim} dims, got shape {tuple(t.shape)}")
    if t.dtype not in _DTYPES:
        raise ValueError(f"{name} must be float32, bfloat16 or float16, got {t.dtype}")
    return t


def check_device(batch: LoRABatch, **tensors: torch.Tensor) -> None:
    if not isinstance(batch, LoRABatch):
        raise ValueError(f"batch must be a LoRABatch, got {type(batch).__name__}")
    for name, t in tensors.items():
        if t.device != batch.device:
            raise ValueError(
                f"{name} is on {t.device} but the LoRABatch is on {batch.device}; "
                "all tensors must be on one device"
            )


def check_shrink(x: torch.Tensor, lora_a: torch.Tensor, batch: LoRABatch) -> None:
    check_float("x", x, 2)
    check_float("lora_a", lora_a, 4)
    check_device(batch, x=x, lora_a=lora_a)
    if lora_a.dtype != x.dtype:
        raise ValueError(f"lora_a dtype {lora_a.dtype} differs from x dtype {x.dtype}")
    if lora_a.shape[0] != batch.num_slots:
        raise ValueError(f"lora_a has {lora_a.shape[0]} slots but the LoRABatch has {batch.num_slots}")
    if lora_a.shape[3] != x.shape[1]:
        raise ValueError(
            f"lora_a in_features {lora_a.shape[3]} differs from x in_features {x.shape[1]} "
            "(lora_a is [num_slots, num_slices, max_rank, in_features])"
        )
    if x.shape[0] > batch.max_tokens:
        raise ValueError(f"x has {x.shape[0]} tokens, over max_tokens={batch.max_tokens}")
    if lora_a.shape[1] < 1 or lora_a.shape[2] < 1:
        raise ValueError(f"lora_a needs at least one slice and rank 1, got {tuple(lora_a.shape)}")


def check_offsets(slice_offsets: Sequence[int], num_slices: int, out_total: int) -> tuple[int, ...]:
    if isinstance(slice_offsets, torch.Tensor) or not isinstance(slice_offsets, Sequence):
        raise ValueError("slice_offsets must be a tuple of ints")
    offs = tuple(slice_offsets)
    if not all(isinstance(o, int) and not isinstance(o, bool) for o in offs):
        raise ValueError(f"slice_offsets must hold ints, got {offs!r}")
    if len(offs) != num_slices + 1:
        raise ValueError(f"slice_offsets needs num_slices + 1 = {num_slices + 1} entries, got {len(offs)}")
    if offs[0] != 0 or offs[-1] != out_total:
        raise ValueError(f"slice_offsets must start at 0 and end at out_total={out_total}: {offs}")
    if any(b < a for a, b in pairwise(offs)):
        raise ValueError(f"slice_offsets must be non-decreasing: {offs}")
    return offs


def check_b(
    y: torch.Tensor,
    lora_b: torch.Tensor,
    batch: LoRABatch,
    num_slices: int,
    max_rank: int,
    slice_offsets: Sequence[int],
) -> tuple[int, ...]:
    check_float("y", y, 2)
    check_float("lora_b", lora_b, 3)
    check_device(batch, y=y, lora_b=lora_b)
    if lora_b.dtype != y.dtype:
        raise ValueError(f"lora_b dtype {lora_b.dtype} differs from y dtype {y.dtype}")
    # fewer: a step's leading slots (``LoRAStep.slot_span``), every token's slot below them
    if not 0 < lora_b.shape[0] <= batch.num_slots:
        raise ValueError(f"lora_b has {lora_b.shape[0]} slots but the LoRABatch has {batch.num_slots}")
    if lora_b.shape[1] != y.shape[1]:
        raise ValueError(
            f"lora_b out_total {lora_b.shape[1]} differs from y width {y.shape[1]} "
            "(lora_b is [num_slots, out_total, max_rank])"
        )
    if lora_b.shape[2] != max_rank:
        raise ValueError(f"lora_b max_rank {lora_b.shape[2]} differs from {max_rank}")
    if y.shape[0] > batch.max_tokens:
        raise ValueError(f"y has {y.shape[0]} tokens, over max_tokens={batch.max_tokens}")
    if any(st == 0 for st, n in zip(y.stride(), y.shape, strict=True) if n > 1):
        raise ValueError("y must not have zero strides (rows or columns would alias)")
    if num_slices > MAX_SLICES:
        raise ValueError(f"at most {MAX_SLICES} slices per projection, got {num_slices}")
    return check_offsets(slice_offsets, num_slices, y.shape[1])


def check_expand(
    y: torch.Tensor,
    buf: torch.Tensor,
    lora_b: torch.Tensor,
    batch: LoRABatch,
    slice_offsets: Sequence[int],
) -> tuple[int, ...]:
    if not isinstance(buf, torch.Tensor) or buf.dim() != 3 or buf.dtype != torch.float32:
        raise ValueError("buf must be a float32 tensor [num_slices, num_tokens, max_rank]")
    check_device(batch, buf=buf)
    offs = check_b(y, lora_b, batch, buf.shape[0], buf.shape[2], slice_offsets)
    if buf.shape[1] != y.shape[0]:
        raise ValueError(f"buf has {buf.shape[1]} tokens but y has {y.shape[0]}")
    return offs


def check_shrunk_in_gemm(
    num_tokens: int,
    out_total: int,
    dtype: torch.dtype,
    shrunk: torch.Tensor,
    lora_b: torch.Tensor,
    slices: int,
) -> None:
    """ValueError unless ``shrunk`` is ``[T, slots, slices, R]`` and ``lora_b`` is
    ``[slots, out_total, R]`` in ``dtype``."""
    if shrunk.dim() != 4 or shrunk.shape[0] != num_tokens or shrunk.shape[2] != slices:
        raise ValueError(
            f"shrunk must be [{num_tokens}, num_slots, {slices}, max_rank], got {tuple(shrunk.shape)}"
        )
    if tuple(lora_b.shape) != (shrunk.shape[1], out_total, shrunk.shape[3]) or lora_b.dtype != dtype:
        raise ValueError(
            f"lora_b must be [{shrunk.shape[1]}, {out_total}, {shrunk.shape[3]}] in {dtype}, "
            f"got {tuple(lora_b.shape)} {lora_b.dtype}"
        )
