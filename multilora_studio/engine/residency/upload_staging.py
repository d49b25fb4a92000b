"""Pinned copies of host-tier adapters held in pageable memory, made for their slot uploads.

Thread contract: ``staged`` and ``forget`` run on the engine's worker thread (its uploads);
the copies run on two stager threads, which wake the worker when one is done.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from multilora_studio.engine.model.lora_weights import PackedAdapter
from multilora_studio.engine.residency.pinned_arena import PinnedArena, carve

log = logging.getLogger(__name__)


class UploadStager:
    """Adapter -> its pinned copy in the making, taken from ``arena``'s free blocks."""

    def __init__(self, arena: PinnedArena, dtype: torch.dtype, wake: Callable[[], None]) -> None:
        self.arena = arena
        self.dtype = dtype
        self._wake = wake
        self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="adapter-stager")
        self._staging: dict[str, Future[PackedAdapter]] = {}

    def staged(self, packed: PackedAdapter) -> PackedAdapter | None:
        """A pinned copy of ``packed`` (held in pageable memory) for its upload, made on a stager
        thread; None while it is being made, or while no pinned block is free."""
        future = self._staging.get(packed.name)
        if future is None:
            if not self.arena.free_blocks:
                return None  # every block is in use: asked again on the next turn (not counted)
            staged = PackedAdapter(packed.name, packed.rank, {}, {}, pinned=True)
            block = self.arena.take(staged)
            if block is None:
                return None
            future = self._executor.submit(stage_copy, packed, staged, block, self.dtype)
            future.add_done_callback(lambda _: self._wake())
            self._staging[packed.name] = future
            return None
        if not future.done():
            return None
        del self._staging[packed.name]
        try:
            return future.result()
        except Exception:  # not expected (the shapes are the packed ones): upload from pageable memory
            log.exception("staging %s for its upload failed; copying it from pageable memory", packed.name)
            return packed

    def forget(self, name: str) -> None:
        """Drop ``name``'s copy in the making (the adapter is removed)."""
        self._staging.pop(name, None)

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)


def stage_copy(
    packed: PackedAdapter, staged: PackedAdapter, block: torch.Tensor, dtype: torch.dtype
) -> PackedAdapter:
    """Fill ``staged`` with ``packed``'s tensors, copied into the pinned ``block``."""
    groups, keys = list(packed.a), list(packed.rows)
    sources = [t for g in groups for t in (packed.a[g], packed.b[g])] + [packed.rows[k] for k in keys]
    views = carve(block, [tuple(t.shape) for t in sources], dtype, zero=False)
    for view, source in zip(views, sources, strict=True):
        view.copy_(source)
    staged.a = {g: views[2 * i] for i, g in enumerate(groups)}
    staged.b = {g: views[2 * i + 1] for i, g in enumerate(groups)}
    staged.rows = dict(zip(keys, views[2 * len(groups) :], strict=True))
    staged.tokens = packed.tokens
    return staged
