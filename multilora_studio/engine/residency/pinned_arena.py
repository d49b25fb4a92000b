"""Pinned host memory for the host adapter tier, allocated once when the engine starts.

Page-locking memory (``cudaHostAlloc``) takes hundreds of milliseconds for an 8B model's
adapter and holds the CUDA driver's lock meanwhile, so pinning memory while the worker thread
launches steps stalls them (measured: 0.35-0.45 s a 0.5 GB chunk on the H200 host). The arena
pins a fixed number of blocks up front that loads borrow and give back: the host tier's most
recent adapters live in them, and ``keep`` blocks stay free for staging the upload of an
adapter that the tier holds in pageable memory (engine/residency/upload_staging.py).

A block goes back to the arena when the owner it was taken for (a :class:`PackedAdapter`) is
garbage collected; the engine keeps a reference to a packed adapter until its upload's copies
have completed, so a block is never refilled while a copy still reads it.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Protocol

import torch

log = logging.getLogger(__name__)

# Memory is carved into tensors at this alignment (bytes).
ALIGN = 256


def _physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not on Linux / macOS
        return None


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


class BlockSource(Protocol):
    """Where ``pack_adapter`` can take one block of host memory for an adapter."""

    block_bytes: int
    pin: bool  # whether its blocks are page-locked

    def take(self, owner: object, keep: int = 0) -> torch.Tensor | None: ...


class PinnedArena:
    """``num_blocks`` pinned blocks of ``block_bytes`` each, in one allocation.

    ``pin=False`` gives the same arena in pageable memory (for machines without CUDA).
    """

    def __init__(self, block_bytes: int, num_blocks: int, pin: bool = True) -> None:
        if block_bytes < 1 or num_blocks < 1:
            raise ValueError(f"a pinned arena needs blocks, got {num_blocks} x {block_bytes} bytes")
        self.block_bytes = aligned(block_bytes)
        self.num_blocks = num_blocks
        self.pin = pin
        self._memory = torch.empty((num_blocks, self.block_bytes), dtype=torch.uint8, pin_memory=pin)
        self._free = list(range(num_blocks))
        self._lock = threading.Lock()
        self.exhausted = 0  # takes that found no block they could have (the adapter then stays pageable)

    @classmethod
    def for_tier(cls, block_bytes: int, blocks: int, ram_fraction: float = 0.25) -> PinnedArena | None:
        """An arena of ``blocks`` blocks, fewer if that would pin more than ``ram_fraction``
        of physical memory; None when not even one fits or the memory cannot be pinned
        (adapters then stay in pageable memory and are staged for their uploads)."""
        total = _physical_memory_bytes()
        if total is not None:
            blocks = min(blocks, int(total * ram_fraction) // max(1, aligned(block_bytes)))
        if blocks < 1:
            return None
        log.info("pinning %d host blocks of %.1f MB for the adapter tier", blocks, block_bytes / 1e6)
        try:
            return cls(block_bytes, blocks)
        except RuntimeError as error:  # e.g. a locked-memory limit
            mb = block_bytes / 1e6
            log.warning("could not pin %d x %.1f MB for the adapter tier: %s", blocks, mb, error)
            return None

    @property
    def free_blocks(self) -> int:
        with self._lock:
            return len(self._free)

    def owns(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor``'s memory lies in the arena."""
        start = self._memory.data_ptr()
        return start <= tensor.data_ptr() < start + self._memory.numel()

    def take(self, owner: object, keep: int = 0) -> torch.Tensor | None:
        """A free block as a uint8 tensor, returned to the arena when ``owner`` is collected;
        None unless more than ``keep`` blocks are free."""
        with self._lock:
            if len(self._free) <= keep:
                self.exhausted += 1
                return None
            index = self._free.pop()
        weakref.finalize(owner, self._give, index)
        return self._memory[index]

    def _give(self, index: int) -> None:
        with self._lock:
            self._free.append(index)


def carve(
    block: torch.Tensor, shapes: list[tuple[int, ...]], dtype: torch.dtype, zero: bool = True
) -> list[torch.Tensor]:
    """Tensors of ``shapes`` laid out one after another in ``block`` (aligned), zeroed
    unless ``zero=False`` (views of bytes already laid out this way)."""
    out = []
    offset = 0
    itemsize = torch.empty((), dtype=dtype).element_size()
    for shape in shapes:
        numel = 1
        for dim in shape:
            numel *= dim
        nbytes = numel * itemsize
        if offset + nbytes > block.numel():
            raise ValueError(f"{shapes} do not fit in a block of {block.numel()} bytes")
        view = block[offset : offset + nbytes].view(dtype).view(shape)
        if zero:
            view.zero_()
        out.append(view)
        offset += aligned(nbytes)
    return out


def carved_bytes(shapes: list[tuple[int, ...]], dtype: torch.dtype) -> int:
    """Bytes that ``carve`` needs for ``shapes``."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    total = 0
    for shape in shapes:
        numel = 1
        for dim in shape:
            numel *= dim
        total += aligned(numel * itemsize)
    return total
