"""Per-step adapter metadata of the LoRA kernels (:class:`LoRABatch`), filled on the device or the host.

``LoRABatch.update`` refills the batch's fixed-size device buffers from per-token slot ids
without synchronising with the host, so CUDA graphs can capture the kernels that read them.
For steps whose slot ids are known on the host (the engine's decode steps),
:func:`fill_lora_metadata` builds the same words with numpy, in the batch's shared-storage
layout, so one host-to-device copy refreshes the whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

__all__ = ["LoRABatch", "build_lora_batch", "fill_lora_metadata"]


@dataclass(eq=False)
class LoRABatch:
    """Device-side adapter metadata of one step, in fixed-size buffers.

    Built from ``slot_ids`` with torch ops that never synchronise with the host (sort and
    searchsorted, no bincount / nonzero / unique / ``.item()``), so ``update`` can run
    between CUDA-graph replays and the kernels captured in the graph read fresh values.

    Buffers (int32 unless noted, on ``device``):

    * ``token_slots``   ``[max_tokens]``: slot of each token; positions ``>= T`` of the
      last update, and slot values outside ``[0, num_slots)``, hold -1.
    * ``token_ranks``   ``[max_tokens]``: rank of each token's adapter, 0 for -1 tokens
      and empty slots (the token-major decode kernels read it next to ``token_slots``).
    * ``token_scales``  ``[max_tokens]`` float32: each token's adapter strength, the factor
      of its LoRA term (1.0 by default and for positions ``>= T``; stored as int32 words of
      the shared storage, viewed as float32).
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
    token_scales: torch.Tensor
    sorted_tokens: torch.Tensor
    slot_starts: torch.Tensor
    slot_counts: torch.Tensor
    slot_ranks: torch.Tensor
    num_tokens: torch.Tensor
    _boundaries: torch.Tensor  # [num_slots + 1] int32: 0..num_slots, for searchsorted
    # The torch ops' host copy of the grouping (``lora_torch``), made on first use and
    # dropped by every refill.
    host_grouping: Any = field(default=None, repr=False)
    _arrays: tuple[tuple[torch.Tensor, ...], tuple[np.ndarray, ...]] | None = field(default=None, repr=False)
    # Whether some token of the last fill has a strength other than 1.0 (kept on the host,
    # so the torch ops skip the multiply for batches that ask none without reading the device).
    scaled: bool = field(default=False, repr=False)

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
            token_scales=torch.ones(max_tokens, dtype=torch.float32, device=device),  # [max_tokens]
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
        :func:`fill_lora_metadata`, which builds the
        same words on the host so that one copy refreshes them all.
        """
        layout: dict[str, tuple[int, int]] = {}
        offset = 0
        for name, length in (
            ("token_slots", max_tokens),
            ("token_ranks", max_tokens),
            ("token_scales", max_tokens),
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
            token_scales=view("token_scales").view(torch.float32),
            sorted_tokens=view("sorted_tokens"),
            slot_starts=view("slot_starts"),
            slot_counts=view("slot_counts"),
            slot_ranks=view("slot_ranks"),
            num_tokens=view("num_tokens"),
            _boundaries=torch.arange(num_slots + 1, dtype=torch.int32, device=storage.device),
        )

    def host_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """numpy views of ``token_slots``, ``token_ranks``, ``sorted_tokens``, ``token_scales``
        (CPU buffers only).

        Made once: ``update`` and the staged fills write the buffers in place, so the views
        always show the current step (checked by identity in case a buffer is replaced).
        """
        buffers = (self.token_slots, self.token_ranks, self.sorted_tokens, self.token_scales)
        arrays = self._arrays
        if arrays is None or any(a is not b for a, b in zip(arrays[0], buffers, strict=True)):
            self._arrays = arrays = (buffers, tuple(buffer.numpy() for buffer in buffers))
        return arrays[1]  # type: ignore[return-value]

    def mark_filled(self, num_tokens: int, scaled: bool = False) -> None:
        """Record that the buffers were rewritten outside :meth:`update` for ``num_tokens`` tokens
        (``scaled``: some token's strength is not 1.0)."""
        self.host_grouping = None
        self.scaled = scaled

    @property
    def device(self) -> torch.device:
        return self.token_slots.device

    def update(
        self,
        slot_ids: torch.Tensor,
        slot_ranks: torch.Tensor,
        token_scales: torch.Tensor | None = None,
    ) -> LoRABatch:
        """Refill the buffers in place from ``slot_ids [T]`` and ``slot_ranks [num_slots]``.

        ``token_scales`` (float32 ``[T]``, on the batch's device) gives each token's adapter
        strength; None: 1.0 for every token. No host synchronisation; safe to call between
        CUDA-graph replays. Returns self.
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
        if token_scales is not None and (
            not isinstance(token_scales, torch.Tensor)
            or token_scales.shape != (t,)
            or token_scales.dtype != torch.float32
            or token_scales.device != self.device
        ):
            raise ValueError(f"token_scales must be a float32 tensor [{t}] on {self.device} (one per token)")
        ids = self.token_slots
        ids[:t].copy_(slot_ids)
        ids[t:].fill_(-1)
        invalid = (ids < 0) | (ids >= self.num_slots)  # [max_tokens]
        ids.masked_fill_(invalid, -1)
        self.slot_ranks.copy_(slot_ranks)
        torch.index_select(self.slot_ranks, 0, ids.clamp(min=0), out=self.token_ranks)
        self.token_ranks.masked_fill_(invalid, 0)
        self.token_scales.fill_(1.0)
        if token_scales is not None:
            self.token_scales[:t].copy_(token_scales)
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
        self.host_grouping = None
        self.scaled = token_scales is not None
        return self


def build_lora_batch(
    slot_ids: torch.Tensor,
    slot_ranks: torch.Tensor,
    num_slots: int,
    token_scales: torch.Tensor | None = None,
) -> LoRABatch:
    """Allocate a :class:`LoRABatch` sized for ``slot_ids`` and fill it."""
    if not isinstance(slot_ids, torch.Tensor) or slot_ids.dim() != 1:
        raise ValueError("slot_ids must be a 1-D integer tensor [num_tokens]")
    batch = LoRABatch.allocate(max(1, slot_ids.shape[0]), num_slots, slot_ids.device)
    return batch.update(slot_ids, slot_ranks, token_scales)


def fill_lora_metadata(
    words: np.ndarray,
    max_tokens: int,
    num_slots: int,
    slot_ids: Sequence[int] | np.ndarray,
    slot_ranks: Sequence[int] | np.ndarray,
    token_scales: Sequence[float] | np.ndarray | None = None,
) -> None:
    """Write the batch of ``slot_ids`` [T] into ``words`` (int32, ``storage_layout`` order).

    The result equals what ``LoRABatch.update(slot_ids, slot_ranks, token_scales)`` leaves
    in a batch ``on_storage`` of the same words: slots outside ``[0, num_slots)`` count as
    -1, positions ``>= T`` hold -1 and strength 1.0, tokens sorted stably by slot with -1
    tokens last. ``token_scales`` None: 1.0 for every token.
    """
    layout = LoRABatch.storage_layout(max_tokens, num_slots)
    if words.dtype != np.int32 or words.ndim != 1 or words.shape[0] < layout["total"][1]:
        raise ValueError(f"words must be a 1-D int32 array of at least {layout['total'][1]} elements")
    ids_in = np.asarray(slot_ids, dtype=np.int64)
    ranks = np.asarray(slot_ranks, dtype=np.int32)
    t = ids_in.shape[0]
    if ids_in.ndim != 1 or t > max_tokens:
        raise ValueError(f"slot_ids must be 1-D with at most max_tokens={max_tokens} entries")
    if ranks.shape != (num_slots,):
        raise ValueError(f"slot_ranks must have shape [{num_slots}] (one rank per slot)")
    if token_scales is not None and np.shape(token_scales) != (t,):
        raise ValueError(f"token_scales must have shape [{t}] (one per token)")

    def view(name: str) -> np.ndarray:
        offset, length = layout[name]
        return words[offset : offset + length]

    ids = np.full(max_tokens, -1, dtype=np.int64)  # [max_tokens]
    ids[:t] = ids_in
    invalid = (ids < 0) | (ids >= num_slots)
    ids[invalid] = -1
    view("token_slots")[:] = ids
    token_ranks = ranks[np.clip(ids, 0, num_slots - 1)]  # [max_tokens]
    token_ranks[invalid] = 0
    view("token_ranks")[:] = token_ranks
    scales = view("token_scales").view(np.float32)  # [max_tokens]
    scales[:] = 1.0
    if token_scales is not None:
        scales[:t] = token_scales
    key = np.where(invalid, num_slots, ids)  # "no adapter" sorts past the last slot
    view("sorted_tokens")[:] = np.argsort(key, kind="stable")
    counts = np.bincount(key, minlength=num_slots + 1)[:num_slots]  # [num_slots]
    view("slot_counts")[:] = counts
    view("slot_starts")[:] = np.cumsum(counts) - counts
    view("slot_ranks")[:] = ranks
    view("num_tokens")[0] = t
