"""A :class:`~.lora.LoRABatch`'s metadata computed on the host, in its shared-storage layout.

For steps whose slot ids are known on the host (the engine's decode steps), numpy builds
the same words that :meth:`LoRABatch.update` computes with about 15 device ops, so one
host-to-device copy refreshes the whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .lora import LoRABatch


def fill_lora_metadata(
    words: np.ndarray,
    max_tokens: int,
    num_slots: int,
    slot_ids: Sequence[int] | np.ndarray,
    slot_ranks: Sequence[int] | np.ndarray,
) -> None:
    """Write the batch of ``slot_ids`` [T] into ``words`` (int32, ``storage_layout`` order).

    The result equals what ``LoRABatch.update(slot_ids, slot_ranks)`` leaves in a batch
    ``on_storage`` of the same words: slots outside ``[0, num_slots)`` count as -1,
    positions ``>= T`` hold -1, tokens sorted stably by slot with -1 tokens last.
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
    key = np.where(invalid, num_slots, ids)  # "no adapter" sorts past the last slot
    view("sorted_tokens")[:] = np.argsort(key, kind="stable")
    counts = np.bincount(key, minlength=num_slots + 1)[:num_slots]  # [num_slots]
    view("slot_counts")[:] = counts
    view("slot_starts")[:] = np.cumsum(counts) - counts
    view("slot_ranks")[:] = ranks
    view("num_tokens")[0] = t
