"""Multi-LoRA shrink / expand: the LoRA term of a projection for a batch that mixes adapters.

Every LoRA-targeted linear computes ``y = x W^T + (x A^T) B^T`` where the base GEMM is
shared by all rows and the LoRA term uses, for each token, the adapter held in that
token's GPU slot (scale already folded into B). The LoRA term runs as two launches per
projection, whatever the mix of adapters (SGMV/BGMV style):

* shrink:  ``buf[s, t, :] = x[t] @ lora_a[slot[t], s]^T``   (in_features -> rank)
* expand:  ``y[t, off_s:off_s+n_s] += buf[s, t] @ lora_b[slot[t], off_s:off_s+n_s, :]^T``

Storage layout (allocated by the engine, one set per targeted projection and layer):

* ``lora_a``: ``[num_slots, num_slices, max_rank, in_features]``. Slice ``s`` is the A
  matrix of the ``s``-th fused projection (q/k/v, gate/up; one slice otherwise). Rank rows
  ``r >= slot_ranks[slot]`` must be zero: the Triton kernels never read them, the torch
  backend's decode path may.
* ``lora_b``: ``[num_slots, out_total, max_rank]``. Slice ``s`` occupies output rows
  ``slice_offsets[s]:slice_offsets[s+1]`` (slices may differ in width: q/k/v with GQA,
  gate/up). The LoRA scale is folded into B. Rank columns beyond the slot's rank must be
  zero, as in lora_a.
* ``slot_ranks``: ``[num_slots]`` int32 on the device: the true rank of each slot's
  adapter, 0 for an empty slot. Kernels skip rank blocks beyond it, so a batch that mixes
  rank 8 and rank 64 adapters does not pay rank 64 for every token.
* ``slot_ids``: ``[T]`` int32 (or int64): the slot of each token, -1 = no adapter. Rows
  with -1 cost nothing and are left untouched in ``y``.

Per-step metadata lives in a :class:`LoRABatch` (fixed-size device buffers, refilled in
place without host synchronisation, so CUDA graphs can capture the kernels that read it).

Backends: ``"triton"`` (the kernels in ``lora_triton``; on CPU only under
``TRITON_INTERPRET=1``), ``"torch"`` (vectorised torch ops), ``"numba"`` (``add_lora``
only: the compiled float32 CPU kernel in ``lora_cpu``; shrink and expand alone fall back to
torch) and ``"auto"`` (Triton for CUDA tensors; on the CPU, numba for float32 batches of up
to ``lora_cpu.MAX_TOKENS`` tokens and torch otherwise).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np
import torch

from . import lora_cpu

__all__ = [
    "LoRABatch",
    "add_lora",
    "build_lora_batch",
    "lora_expand",
    "lora_shrink",
    "reference_lora",
    "reference_shrink",
]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_BACKENDS = ("auto", "triton", "torch", "numba")
# Fused projections in our models have at most 3 slices (q/k/v); the kernels take 4.
MAX_SLICES = 4


# The torch backend's decode path multiplies every token by every active adapter
# ("stacked"): a few large ops instead of a few small ops per adapter. On CPU it wins
# from 3 adapters up to this many tokens (135M default model, docs/kernels.md).
_STACKED_MAX_TOKENS = 32
_STACKED_MIN_GROUPS = 3


@dataclass(eq=False)
class _HostGroups:
    """Host copy of a batch's grouping, made on first use by the torch backend."""

    num_tokens: int
    # One entry per slot that has tokens and a non-zero rank:
    # (slot, rank, first, last, idx) where idx is None when the tokens are first..last-1.
    groups: list[tuple[int, int, int, int, torch.Tensor | None]]
    max_rank: int  # largest rank among the groups
    # Stacked path (None unless the active slots form one run lo..hi-1 and T is small):
    span: tuple[int, int] | None
    mask: torch.Tensor | None  # [hi - lo, T, 1] bool: token t uses slot lo + g
    valid: torch.Tensor | None  # [n] int64 tokens with an adapter; None when all have one


@dataclass(eq=False)
class LoRABatch:
    """Device-side adapter metadata of one step, in fixed-size buffers.

    Built from ``slot_ids`` with torch ops that never synchronise with the host (sort and
    searchsorted, no bincount / nonzero / unique / ``.item()``), so ``update`` can run
    between CUDA-graph replays and the kernels captured in the graph read fresh values.

    Buffers (all int32, on ``device``):

    * ``token_slots``   ``[max_tokens]``: slot of each token; positions ``>= T`` of the
      last update, and slot values outside ``[0, num_slots)``, hold -1.
    * ``token_ranks``   ``[max_tokens]``: rank of each token's adapter, 0 for -1 tokens
      and empty slots (the token-major decode kernels read it next to ``token_slots``).
    * ``sorted_tokens`` ``[max_tokens]``: token indices stably sorted by slot; tokens
      without an adapter come last. Tokens of slot ``l`` are
      ``sorted_tokens[slot_starts[l] : slot_starts[l] + slot_counts[l]]``, ascending.
    * ``slot_starts``   ``[num_slots]``: offset of each slot's first token in
      ``sorted_tokens``.
    * ``slot_counts``   ``[num_slots]``: number of tokens using each slot.
    * ``slot_ranks``    ``[num_slots]``: rank of the adapter in each slot, 0 = empty.
    * ``num_tokens``    ``[1]``: T of the last update (tokens ``>= T`` count as -1).

    The kernels also bound every token index by ``x.shape[0]``, so an ``x`` with fewer
    rows than the last update never reads out of bounds.
    """

    max_tokens: int
    num_slots: int
    token_slots: torch.Tensor
    token_ranks: torch.Tensor
    sorted_tokens: torch.Tensor
    slot_starts: torch.Tensor
    slot_counts: torch.Tensor
    slot_ranks: torch.Tensor
    num_tokens: torch.Tensor
    _boundaries: torch.Tensor  # [num_slots + 1] int32: 0..num_slots, for searchsorted
    _num_tokens_host: int = 0
    _host: _HostGroups | None = field(default=None, repr=False)
    _arrays: tuple[tuple[torch.Tensor, ...], tuple[np.ndarray, ...]] | None = field(default=None, repr=False)

    @classmethod
    def allocate(cls, max_tokens: int, num_slots: int, device: torch.device | str = "cpu") -> LoRABatch:
        """Allocate the buffers for up to ``max_tokens`` tokens and ``num_slots`` slots.

        The batch starts with no tokens (every token -1) and every slot empty.
        """
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
        if not isinstance(num_slots, int) or num_slots < 1:
            raise ValueError(f"num_slots must be a positive int, got {num_slots!r}")
        device = torch.device(device)
        i32: dict[str, Any] = dict(dtype=torch.int32, device=device)
        batch = cls(
            max_tokens=max_tokens,
            num_slots=num_slots,
            token_slots=torch.full((max_tokens,), -1, **i32),  # [max_tokens]
            token_ranks=torch.zeros(max_tokens, **i32),  # [max_tokens]
            sorted_tokens=torch.arange(max_tokens, **i32),  # [max_tokens]
            slot_starts=torch.zeros(num_slots, **i32),  # [num_slots]
            slot_counts=torch.zeros(num_slots, **i32),  # [num_slots]
            slot_ranks=torch.zeros(num_slots, **i32),  # [num_slots]
            num_tokens=torch.zeros(1, **i32),  # [1]
            _boundaries=torch.arange(num_slots + 1, **i32),  # [num_slots + 1]
        )
        return batch

    @staticmethod
    def storage_layout(max_tokens: int, num_slots: int) -> dict[str, tuple[int, int]]:
        """Offset and length (int32 words) of each buffer when they share one storage.

        Every buffer starts on a 16-byte boundary. Used by :meth:`on_storage` and by
        :func:`~multilora_studio.kernels.lora_host.fill_lora_metadata`, which builds the
        same words on the host so that one copy refreshes them all.
        """
        layout: dict[str, tuple[int, int]] = {}
        offset = 0
        for name, length in (
            ("token_slots", max_tokens),
            ("token_ranks", max_tokens),
            ("sorted_tokens", max_tokens),
            ("slot_starts", num_slots),
            ("slot_counts", num_slots),
            ("slot_ranks", num_slots),
            ("num_tokens", 1),
        ):
            layout[name] = (offset, length)
            offset += -(-length // 4) * 4
        layout["total"] = (0, offset)
        return layout

    @classmethod
    def on_storage(cls, storage: torch.Tensor, max_tokens: int, num_slots: int) -> LoRABatch:
        """A batch whose buffers are views of ``storage`` (1-D int32, contiguous, at least
        ``storage_layout(...)["total"]`` words), laid out by :meth:`storage_layout`.

        The views start as ``storage`` holds them; fill it (on the host, then one copy)
        and call :meth:`mark_filled`, or call :meth:`update`.
        """
        layout = cls.storage_layout(max_tokens, num_slots)
        total = layout["total"][1]
        if (
            not isinstance(storage, torch.Tensor)
            or storage.dtype != torch.int32
            or storage.dim() != 1
            or not storage.is_contiguous()
            or storage.numel() < total
        ):
            raise ValueError(f"storage must be a contiguous 1-D int32 tensor of at least {total} elements")

        def view(name: str) -> torch.Tensor:
            offset, length = layout[name]
            return storage[offset : offset + length]

        return cls(
            max_tokens=max_tokens,
            num_slots=num_slots,
            token_slots=view("token_slots"),
            token_ranks=view("token_ranks"),
            sorted_tokens=view("sorted_tokens"),
            slot_starts=view("slot_starts"),
            slot_counts=view("slot_counts"),
            slot_ranks=view("slot_ranks"),
            num_tokens=view("num_tokens"),
            _boundaries=torch.arange(num_slots + 1, dtype=torch.int32, device=storage.device),
        )

    def host_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """numpy views of ``token_slots``, ``token_ranks``, ``sorted_tokens`` (CPU buffers only).

        Made once: ``update`` and the staged fills write the buffers in place, so the views
        always show the current step (checked by identity in case a buffer is replaced).
        """
        buffers = (self.token_slots, self.token_ranks, self.sorted_tokens)
        arrays = self._arrays
        if arrays is None or any(a is not b for a, b in zip(arrays[0], buffers, strict=True)):
            self._arrays = arrays = (buffers, tuple(buffer.numpy() for buffer in buffers))
        return arrays[1]  # type: ignore[return-value]

    def mark_filled(self, num_tokens: int) -> None:
        """Record that the buffers were rewritten outside :meth:`update` for ``num_tokens`` tokens."""
        self._num_tokens_host = num_tokens
        self._host = None

    @property
    def device(self) -> torch.device:
        return self.token_slots.device

    def update(self, slot_ids: torch.Tensor, slot_ranks: torch.Tensor) -> LoRABatch:
        """Refill the buffers in place from ``slot_ids [T]`` and ``slot_ranks [num_slots]``.

        No host synchronisation; safe to call between CUDA-graph replays. Returns self.
        """
        if not isinstance(slot_ids, torch.Tensor) or slot_ids.dim() != 1:
            raise ValueError("slot_ids must be a 1-D integer tensor [num_tokens]")
        if slot_ids.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"slot_ids must be int32 or int64, got {slot_ids.dtype}")
        if not isinstance(slot_ranks, torch.Tensor) or slot_ranks.shape != (self.num_slots,):
            raise ValueError(f"slot_ranks must be a tensor of shape [{self.num_slots}] (one rank per slot)")
        if slot_ranks.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"slot_ranks must be int32 or int64, got {slot_ranks.dtype}")
        if slot_ids.device != self.device or slot_ranks.device != self.device:
            raise ValueError(
                f"slot_ids ({slot_ids.device}) and slot_ranks ({slot_ranks.device}) must be "
                f"on the batch's device ({self.device})"
            )
        t = slot_ids.shape[0]
        if t > self.max_tokens:
            raise ValueError(f"{t} tokens exceed the batch's max_tokens={self.max_tokens}")
        ids = self.token_slots
        ids[:t].copy_(slot_ids)
        ids[t:].fill_(-1)
        invalid = (ids < 0) | (ids >= self.num_slots)  # [max_tokens]
        ids.masked_fill_(invalid, -1)
        self.slot_ranks.copy_(slot_ranks)
        torch.index_select(self.slot_ranks, 0, ids.clamp(min=0), out=self.token_ranks)
        self.token_ranks.masked_fill_(invalid, 0)
        # Sort key: the slot, with "no adapter" mapped past the last slot.
        key = ids.masked_fill(invalid, self.num_slots)  # [max_tokens]
        sorted_key, order = torch.sort(key, stable=True)
        self.sorted_tokens.copy_(order)
        bounds = torch.searchsorted(sorted_key, self._boundaries)  # [num_slots + 1] int64
        self.slot_starts.copy_(bounds[:-1])
        self.slot_counts.copy_(bounds[1:] - bounds[:-1])
        # Written last: kernels launched with programmatic dependent launch read the
        # buffers above before waiting on the previous kernel, never num_tokens.
        self.num_tokens.fill_(t)
        self._num_tokens_host = t
        self._host = None
        return self


def build_lora_batch(slot_ids: torch.Tensor, slot_ranks: torch.Tensor, num_slots: int) -> LoRABatch:
    """Allocate a :class:`LoRABatch` sized for ``slot_ids`` and fill it."""
    if not isinstance(slot_ids, torch.Tensor) or slot_ids.dim() != 1:
        raise ValueError("slot_ids must be a 1-D integer tensor [num_tokens]")
    batch = LoRABatch.allocate(max(1, slot_ids.shape[0]), num_slots, slot_ids.device)
    return batch.update(slot_ids, slot_ranks)


# ----------------------------------------------------------------------------- checks


def _check_float(name: str, t: object, dim: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dim:
        raise ValueError(f"{name} must have {dim} dims, got shape {tuple(t.shape)}")
    if t.dtype not in _DTYPES:
        raise ValueError(f"{name} must be float32, bfloat16 or float16, got {t.dtype}")
    return t


def _check_device(batch: LoRABatch, **tensors: torch.Tensor) -> None:
    if not isinstance(batch, LoRABatch):
        raise ValueError(f"batch must be a LoRABatch, got {type(batch).__name__}")
    for name, t in tensors.items():
        if t.device != batch.device:
            raise ValueError(
                f"{name} is on {t.device} but the LoRABatch is on {batch.device}; "
                "all tensors must be on one device"
            )


def _check_shrink(x: torch.Tensor, lora_a: torch.Tensor, batch: LoRABatch) -> None:
    _check_float("x", x, 2)
    _check_float("lora_a", lora_a, 4)
    _check_device(batch, x=x, lora_a=lora_a)
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


def _check_offsets(slice_offsets: Sequence[int], num_slices: int, out_total: int) -> tuple[int, ...]:
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


def _check_b(
    y: torch.Tensor,
    lora_b: torch.Tensor,
    batch: LoRABatch,
    num_slices: int,
    max_rank: int,
    slice_offsets: Sequence[int],
) -> tuple[int, ...]:
    _check_float("y", y, 2)
    _check_float("lora_b", lora_b, 3)
    _check_device(batch, y=y, lora_b=lora_b)
    if lora_b.dtype != y.dtype:
        raise ValueError(f"lora_b dtype {lora_b.dtype} differs from y dtype {y.dtype}")
    if lora_b.shape[0] != batch.num_slots:
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
    return _check_offsets(slice_offsets, num_slices, y.shape[1])


def _check_expand(
    y: torch.Tensor,
    buf: torch.Tensor,
    lora_b: torch.Tensor,
    batch: LoRABatch,
    slice_offsets: Sequence[int],
) -> tuple[int, ...]:
    if not isinstance(buf, torch.Tensor) or buf.dim() != 3 or buf.dtype != torch.float32:
        raise ValueError("buf must be a float32 tensor [num_slices, num_tokens, max_rank]")
    _check_device(batch, buf=buf)
    offs = _check_b(y, lora_b, batch, buf.shape[0], buf.shape[2], slice_offsets)
    if buf.shape[1] != y.shape[0]:
        raise ValueError(f"buf has {buf.shape[1]} tokens but y has {y.shape[0]}")
    return offs


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _backend_of(backend: str, device: torch.device) -> str:
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
    if backend == "torch":
        return "torch"
    if backend == "numba":
        if not lora_cpu.AVAILABLE:
            raise ValueError("backend='numba' but Numba cannot be imported")
        if device.type != "cpu":
            raise ValueError(f"backend='numba' needs CPU tensors, got {device}")
        return "numba"
    if device.type != "cuda" and not (backend == "triton" and _interpreting()):
        if backend == "triton":
            raise ValueError(f"backend='triton' needs CUDA tensors (got {device}) or TRITON_INTERPRET=1")
        return "torch"
    try:
        from . import lora_triton  # noqa: F401  (import check only)
    except ImportError as exc:
        if backend == "triton":
            raise ValueError(f"backend='triton' but Triton cannot be imported: {exc}") from exc
        return "torch"
    return "triton"


# ------------------------------------------------------------------------- public API


def lora_shrink(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    batch: LoRABatch,
    out: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Project every token onto its adapter's A matrices: ``[T, K] -> [S, T, R]`` float32.

    Args:
        x: ``[T, in_features]`` activations (fp32 / bf16 / fp16), any strides.
        lora_a: ``[num_slots, num_slices, max_rank, in_features]``, x's dtype.
        batch: the step's :class:`LoRABatch` (``T <= batch.max_tokens``).
        out: optional float32 ``[num_slices, T, max_rank]`` to write into.
        backend: ``"auto"``, ``"triton"``, ``"torch"`` (``"numba"`` runs as torch here).

    Returns ``buf`` (``out`` when given). Entries of tokens with slot -1, and entries
    ``r >= slot_ranks[slot]`` (rank blocks the kernels skip), are unspecified on the
    Triton backend; the torch backend writes zeros there.

    Semantics::

        buf = torch.empty(S, T, R, dtype=torch.float32)
        for t in range(T):
            l = slot_ids[t]
            if l >= 0:
                for s in range(S):
                    buf[s, t] = (x[t].float() @ lora_a[l, s].float().T)
    """
    _check_shrink(x, lora_a, batch)
    num_slices, max_rank = lora_a.shape[1], lora_a.shape[2]
    shape = (num_slices, x.shape[0], max_rank)
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.dtype != torch.float32:
            raise ValueError("out must be a float32 tensor")
        if tuple(out.shape) != shape:
            raise ValueError(f"out must have shape {shape}, got {tuple(out.shape)}")
        if out.device != x.device:
            raise ValueError(f"out is on {out.device}, x on {x.device}")
    kind = _backend_of(backend, x.device)
    if kind == "triton":
        from . import lora_triton

        if out is None:
            out = torch.empty(shape, dtype=torch.float32, device=x.device)
        return lora_triton.shrink(x, lora_a, batch, out)
    if out is None:
        out = torch.zeros(shape, dtype=torch.float32, device=x.device)
    else:
        out.zero_()
    _torch_shrink(x, lora_a, batch, out)
    return out


def lora_expand(
    y: torch.Tensor,
    buf: torch.Tensor,
    lora_b: torch.Tensor,
    batch: LoRABatch,
    slice_offsets: Sequence[int],
    backend: str = "auto",
) -> torch.Tensor:
    """Add each token's ``buf @ B^T`` into its output slices of ``y``, in place.

    Args:
        y: ``[T, out_total]`` (fp32 / bf16 / fp16), updated in place; rows with slot -1
            are not touched.
        buf: float32 ``[num_slices, T, max_rank]`` from :func:`lora_shrink`; columns
            ``r >= slot_ranks[slot]`` are ignored (taken as zero, like B's padding).
        lora_b: ``[num_slots, out_total, max_rank]``, y's dtype, scale folded in.
        batch: the step's :class:`LoRABatch`.
        slice_offsets: ``num_slices + 1`` ints; slice ``s`` is ``y[:, off[s]:off[s+1]]``.
        backend: ``"auto"``, ``"triton"``, ``"torch"`` (``"numba"`` runs as torch here).

    Returns ``y``.

    Semantics::

        for t in range(T):
            l = slot_ids[t]
            if l >= 0:
                for s in range(S):
                    lo, hi = slice_offsets[s], slice_offsets[s + 1]
                    y[t, lo:hi] += (buf[s, t] @ lora_b[l, lo:hi].float().T).to(y.dtype)
    """
    offs = _check_expand(y, buf, lora_b, batch, slice_offsets)
    kind = _backend_of(backend, y.device)
    if kind == "triton":
        from . import lora_triton

        lora_triton.expand(y, buf.unsqueeze(0), lora_b, batch, offs)
        return y
    _torch_expand(y, buf, lora_b, batch, offs)
    return y


def lora_expand_gathered(
    y: torch.Tensor,
    shrunk: torch.Tensor,
    lora_b: torch.Tensor,
    batch: LoRABatch,
    slice_offsets: Sequence[int],
    backend: str = "auto",
    validate: bool = True,
) -> torch.Tensor:
    """The expand for a shrink computed against EVERY slot, in place; returns ``y``.

    ``shrunk[t, l, s]`` is ``x[t] @ lora_a[l, s]^T`` for every slot ``l`` (``[T, num_slots,
    num_slices, max_rank]``, any float dtype, any strides), as one GEMM over the base weight
    with every slot's A rows appended produces it; each token reads its own slot's entry.
    Other arguments as in :func:`lora_expand`. On CUDA (and under ``TRITON_INTERPRET=1``)
    one token-major Triton launch for up to ``lora_decode.DECODE_MAX_TOKENS`` tokens; larger
    batches and the CPU gather the rows and run the torch expand.

    Semantics::

        for t in range(T):
            l = slot_ids[t]
            if l >= 0:
                for s in range(S):
                    lo, hi = slice_offsets[s], slice_offsets[s + 1]
                    y[t, lo:hi] += (shrunk[t, l, s].float() @ lora_b[l, lo:hi].float().T).to(y.dtype)
    """
    if validate:
        if not isinstance(shrunk, torch.Tensor) or shrunk.dim() != 4 or not shrunk.is_floating_point():
            raise ValueError("shrunk must be a float tensor [num_tokens, num_slots, num_slices, max_rank]")
        _check_device(batch, shrunk=shrunk)
        offs = _check_b(y, lora_b, batch, shrunk.shape[2], shrunk.shape[3], slice_offsets)
        if shrunk.shape[0] != y.shape[0]:
            raise ValueError(f"shrunk has {shrunk.shape[0]} tokens but y has {y.shape[0]}")
        if shrunk.shape[1] != lora_b.shape[0]:
            raise ValueError(f"shrunk has {shrunk.shape[1]} slots but lora_b has {lora_b.shape[0]}")
    else:
        offs = tuple(slice_offsets)
    if _backend_of(backend, y.device) == "triton":
        from . import lora_decode

        if y.shape[0] <= lora_decode.DECODE_MAX_TOKENS:
            return lora_decode.expand_gathered(y, shrunk, lora_b, batch, offs)
    num_tokens = y.shape[0]
    slots = batch.token_slots[:num_tokens].long().clamp(min=0)  # [T]; rows with -1 are never written
    rows = torch.arange(num_tokens, device=y.device)
    buf = shrunk[rows, slots].float().transpose(0, 1)  # [S, T, R]
    _torch_expand(y, buf, lora_b, batch, offs)
    return y


def add_lora(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    batch: LoRABatch,
    slice_offsets: Sequence[int],
    backend: str = "auto",
    validate: bool = True,
) -> torch.Tensor:
    """``y += LoRA(x)`` for a batch mixing adapters: shrink then expand. Returns ``y``.

    Shapes as in :func:`lora_shrink` and :func:`lora_expand`; ``y`` is ``[T, out_total]``
    in x's dtype and rows with slot -1 are left untouched. ``validate=False`` skips the
    argument checks (about 20 us a call on the CPU) for callers whose tensors are consistent
    by construction, such as the engine's slot buffers; ``slice_offsets`` must then be a
    tuple of ints.

    Semantics::

        buf = lora_shrink(x, lora_a, batch)        # [S, T, R] float32
        lora_expand(y, buf, lora_b, batch, slice_offsets)
    """
    if validate:
        _check_shrink(x, lora_a, batch)
        offs = _check_b(y, lora_b, batch, lora_a.shape[1], lora_a.shape[2], slice_offsets)
        if y.dtype != x.dtype:
            raise ValueError(f"y dtype {y.dtype} differs from x dtype {x.dtype}")
        if y.shape[0] != x.shape[0]:
            raise ValueError(f"y has {y.shape[0]} tokens but x has {x.shape[0]}")
    else:
        offs = tuple(slice_offsets)
    kind = _backend_of(backend, x.device)
    if kind == "triton":
        from . import lora_triton

        buf = lora_triton.shrink_partials(x, lora_a, batch)  # [splits, S, T, R] float32
        lora_triton.expand(y, buf, lora_b, batch, offs)
        return y
    if kind == "numba" and x.dtype != torch.float32:
        raise ValueError(f"backend='numba' computes float32 only, got {x.dtype}")
    if kind == "numba" or (backend == "auto" and lora_cpu.supports(y, x)):
        lora_cpu.add_lora_cpu(y, x, lora_a, lora_b, batch.host_arrays(), offs)
        return y
    _torch_add_lora(y, x, lora_a, lora_b, batch, offs)
    return y


# ----------------------------------------------------------------------- torch backend


def _host_groups(batch: LoRABatch, num_tokens: int) -> _HostGroups:
    """Group tokens by slot on the host (cheap on CPU; syncs on CUDA)."""
    host = batch._host
    if host is not None and host.num_tokens == num_tokens:
        return host
    counts = batch.slot_counts.tolist()
    starts = batch.slot_starts.tolist()
    ranks = batch.slot_ranks.tolist()
    sorted_tokens = batch.sorted_tokens.tolist()
    groups: list[tuple[int, int, int, int, torch.Tensor | None]] = []
    group_tokens: list[list[int]] = []
    for slot, (count, start, rank) in enumerate(zip(counts, starts, ranks, strict=True)):
        if count == 0 or rank <= 0:
            continue
        toks = sorted_tokens[start : start + count]
        if toks[-1] >= num_tokens:  # x has fewer rows than the last update
            toks = [t for t in toks if t < num_tokens]
            if not toks:
                continue
        first, last = toks[0], toks[-1] + 1
        idx = None
        if last - first != len(toks):
            idx = torch.tensor(toks, dtype=torch.int64, device=batch.device)
        groups.append((slot, rank, first, last, idx))
        group_tokens.append(toks)
    span = mask = valid = None
    if (
        len(groups) >= _STACKED_MIN_GROUPS
        and num_tokens <= _STACKED_MAX_TOKENS
        and groups[-1][0] - groups[0][0] == len(groups) - 1
    ):
        span = (groups[0][0], groups[-1][0] + 1)
        mask = torch.zeros(len(groups), num_tokens, 1, dtype=torch.bool)
        for g, toks in enumerate(group_tokens):
            mask[g, toks] = True
        mask = mask.to(batch.device)
        n_valid = sum(len(toks) for toks in group_tokens)
        if n_valid < num_tokens:
            valid = torch.tensor(
                sorted(t for toks in group_tokens for t in toks),
                dtype=torch.int64,
                device=batch.device,
            )
    host = _HostGroups(
        num_tokens=num_tokens,
        groups=groups,
        max_rank=max((g[1] for g in groups), default=0),
        span=span,
        mask=mask,
        valid=valid,
    )
    batch._host = host
    return host


def _rows(t: torch.Tensor, first: int, last: int, idx: torch.Tensor | None) -> torch.Tensor:
    return t[first:last] if idx is None else t.index_select(0, idx)


def _group_shrink(xs: torch.Tensor, a_slot: torch.Tensor, rank: int) -> torch.Tensor:
    """``[n, K] x [S, R, K] -> [S, n, rank]`` in xs's dtype, reading rank rows only."""
    num_slices, max_rank, k = a_slot.shape
    if rank == max_rank:
        h = xs @ a_slot.reshape(num_slices * rank, k).T  # [n, S * rank]
        return h.view(-1, num_slices, rank).transpose(0, 1)
    return torch.matmul(xs, a_slot[:, :rank].transpose(1, 2))  # [S, n, rank]


def _group_expand(
    y: torch.Tensor,
    h: torch.Tensor,
    b_slot: torch.Tensor,
    rank: int,
    offs: tuple[int, ...],
    first: int,
    last: int,
    idx: torch.Tensor | None,
) -> None:
    """``y[rows, lo:hi] += h[s] @ b_slot[lo:hi, :rank]^T`` for every slice s.

    Scattered rows go through index_select / index_copy_: index_add_ on a column slice
    of a bfloat16 tensor rewrites every row (through float32) on CPU.
    """
    rows = y[first:last] if idx is None else y.index_select(0, idx)  # [n, out_total]
    for s in range(len(offs) - 1):
        lo, hi = offs[s], offs[s + 1]
        if hi > lo:
            rows[:, lo:hi].addmm_(h[s], b_slot[lo:hi, :rank].T)
    if idx is not None:
        y.index_copy_(0, idx, rows)


def _stacked_add_lora(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    host: _HostGroups,
    offs: tuple[int, ...],
) -> None:
    """Decode path: every token against every active slot, masked; 2 + 3S ops in all."""
    assert host.span is not None and host.mask is not None  # narrowing for type checkers
    lo, hi = host.span
    a = lora_a[lo:hi]  # [G, S, R, K]
    g, num_slices, max_rank, k = a.shape
    t = x.shape[0]
    r = host.max_rank
    if r == max_rank:
        h = (x @ a.reshape(g * num_slices * max_rank, k).T).view(t, g, num_slices, r)
        h = h.permute(2, 1, 0, 3)  # [S, G, T, r]
    else:
        h = torch.matmul(x, a[:, :, :r].transpose(2, 3)).transpose(0, 1)  # [S, G, T, r]
    h = torch.where(host.mask, h, 0)  # tokens keep only their own slot's row
    b = lora_b[lo:hi, :, :r]  # [G, out_total, r]
    valid = host.valid
    rows = y if valid is None else y.index_select(0, valid)  # [n, out_total]
    for s in range(num_slices):
        c0, c1 = offs[s], offs[s + 1]
        if c1 == c0:
            continue
        delta = torch.bmm(h[s], b[:, c0:c1].transpose(1, 2)).sum(0)  # [T, n_s]
        rows[:, c0:c1] += delta if valid is None else delta.index_select(0, valid)
    if valid is not None:
        y.index_copy_(0, valid, rows)


def _torch_add_lora(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    batch: LoRABatch,
    offs: tuple[int, ...],
) -> None:
    host = _host_groups(batch, x.shape[0])
    if host.span is not None:
        _stacked_add_lora(y, x, lora_a, lora_b, host, offs)
        return
    for slot, rank, first, last, idx in host.groups:
        xs = _rows(x, first, last, idx)  # [n, K]
        h = _group_shrink(xs, lora_a[slot], rank)  # [S, n, rank]
        _group_expand(y, h, lora_b[slot], rank, offs, first, last, idx)


def _torch_shrink(x: torch.Tensor, lora_a: torch.Tensor, batch: LoRABatch, out: torch.Tensor) -> None:
    host = _host_groups(batch, x.shape[0])
    for slot, rank, first, last, idx in host.groups:
        xs = _rows(x, first, last, idx).float()  # [n, K]: buf is float32 math
        h = _group_shrink(xs, lora_a[slot, :, :rank].float(), rank)  # [S, n, rank]
        if idx is None:
            out[:, first:last, :rank] = h
        else:
            out[:, idx, :rank] = h


def _torch_expand(
    y: torch.Tensor,
    buf: torch.Tensor,
    lora_b: torch.Tensor,
    batch: LoRABatch,
    offs: tuple[int, ...],
) -> None:
    host = _host_groups(batch, y.shape[0])
    for slot, rank, first, last, idx in host.groups:
        h = buf[:, first:last, :rank] if idx is None else buf[:, idx, :rank]  # [S, n, rank]
        h = h.to(y.dtype)
        _group_expand(y, h, lora_b[slot], rank, offs, first, last, idx)


# ---------------------------------------------------------------------------- reference


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
) -> torch.Tensor:
    """Float64 ``y + LoRA(x)`` for tests (returns a new float64 tensor; y is unchanged)."""
    out = y.double().clone()  # [T, out_total]
    h = reference_shrink(x, lora_a, slot_ids)  # [S, T, R]
    for slot in slot_ids.unique().tolist():
        if slot < 0:
            continue
        rows = (slot_ids == slot).nonzero().flatten()  # [n]
        b = lora_b[slot].double()  # [out_total, R]
        for s in range(len(slice_offsets) - 1):
            lo, hi = slice_offsets[s], slice_offsets[s + 1]
            out[rows, lo:hi] += h[s, rows] @ b[lo:hi].T
    return out
