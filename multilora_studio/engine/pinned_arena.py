"""Pinned host memory for the host adapter tier, allocated in chunks of fixed-size blocks.

Page-locking memory (``cudaHostAlloc``) takes hundreds of milliseconds for an 8B model's
adapter and holds the CUDA driver's lock meanwhile, so pinning each adapter as it loads
stalls the decode steps that the worker thread is launching. The arena pins memory in
chunks of many blocks that loads borrow and give back: the first chunk when the engine
starts (room for the slots' adapters and the next ones), more chunks only when the tier
fills past it, so a large host tier pins (and stalls for) a chunk at a time, once.

A block goes back to the arena when the :class:`PackedAdapter` that owns it is garbage
collected; the engine keeps a reference to a packed adapter until its upload's copies have
completed, so a block is never refilled while a copy still reads it.
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
CHUNK_BYTES = 512 << 20  # memory pinned at once when the arena grows (about 0.2 s of pinning)


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

    def take(self, owner: object) -> torch.Tensor | None: ...


class PinnedArena:
    """Up to ``max_blocks`` blocks of ``block_bytes``: ``first_blocks`` (default all) allocated
    now, the rest in chunks of about ``CHUNK_BYTES`` when a take finds none free.

    ``pin=False`` gives the same arena in pageable memory (for machines without CUDA).
    """

    def __init__(
        self, block_bytes: int, max_blocks: int, pin: bool = True, first_blocks: int | None = None
    ) -> None:
        if block_bytes < 1 or max_blocks < 1:
            raise ValueError(f"a pinned arena needs blocks, got {max_blocks} x {block_bytes} bytes")
        self.block_bytes = aligned(block_bytes)
        self.max_blocks = max_blocks
        self.pin = pin
        self.chunk_blocks = max(1, CHUNK_BYTES // self.block_bytes)
        self._chunks: list[torch.Tensor] = []  # each [blocks, block_bytes] uint8, blocks in a row
        self._free: list[torch.Tensor] = []  # [block_bytes] uint8 views into the chunks
        self._lock = threading.Lock()  # guards _free and the counters
        self._grow_lock = threading.Lock()  # one growth at a time (pinning is slow)
        self.exhausted = 0  # takes that found no free block (each then pinned its adapter alone)
        self._grow(max_blocks if first_blocks is None else max(1, min(first_blocks, max_blocks)))

    @classmethod
    def for_tier(
        cls, block_bytes: int, blocks: int, first_blocks: int | None = None, ram_fraction: float = 0.25
    ) -> PinnedArena | None:
        """An arena of up to ``blocks`` blocks, fewer if that would pin more than ``ram_fraction``
        of physical memory, ``first_blocks`` of them pinned now; None when not even one fits or
        the memory cannot be pinned (adapters are then pinned one by one as they load)."""
        total = _physical_memory_bytes()
        if total is not None:
            blocks = min(blocks, int(total * ram_fraction) // max(1, aligned(block_bytes)))
        if blocks < 1:
            return None
        first = blocks if first_blocks is None else min(first_blocks, blocks)
        log.info(
            "pinning %d host blocks of %.1f MB for the adapter tier (up to %d as it fills)",
            first, block_bytes / 1e6, blocks,
        )  # fmt: skip
        try:
            return cls(block_bytes, blocks, first_blocks=first)
        except RuntimeError as error:  # e.g. a locked-memory limit
            mb = block_bytes / 1e6
            log.warning("could not pin %d x %.1f MB for the adapter tier: %s", first, mb, error)
            return None

    @property
    def num_blocks(self) -> int:
        """Blocks allocated so far."""
        return sum(chunk.shape[0] for chunk in self._chunks)

    @property
    def pinned_bytes(self) -> int:
        return self.num_blocks * self.block_bytes

    @property
    def free_blocks(self) -> int:
        with self._lock:
            return len(self._free)

    def owns(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor``'s memory lies in one of the arena's chunks."""
        pointer = tensor.data_ptr()
        return any(c.data_ptr() <= pointer < c.data_ptr() + c.numel() for c in self._chunks)

    def _grow(self, blocks: int) -> None:
        chunk = torch.empty((blocks, self.block_bytes), dtype=torch.uint8, pin_memory=self.pin)
        self._chunks.append(chunk)
        with self._lock:
            self._free.extend(chunk.unbind(0))

    def _grow_when_empty(self) -> None:
        """Add a chunk if no block is free and there is room to; stop growing when pinning fails."""
        with self._grow_lock:
            if self.free_blocks or self.num_blocks >= self.max_blocks:
                return
            blocks = min(self.chunk_blocks, self.max_blocks - self.num_blocks)
            try:
                self._grow(blocks)
            except RuntimeError as error:  # e.g. a locked-memory limit: keep what there is
                log.warning("could not pin %d more adapter blocks (%s); the tier keeps %d", blocks, error,
                            self.num_blocks)  # fmt: skip
                self.max_blocks = self.num_blocks
                return
            log.info("pinned %d more adapter blocks: %d of %d", blocks, self.num_blocks, self.max_blocks)

    def take(self, owner: object) -> torch.Tensor | None:
        """A free block as a uint8 tensor, returned to the arena when ``owner`` is collected;
        None when every block is taken and the arena cannot grow."""
        self._grow_when_empty()
        with self._lock:
            if not self._free:
                self.exhausted += 1
                log.warning(
                    "all %d pinned adapter blocks are in use; this adapter is pinned on its own "
                    "(slow, and it holds the CUDA driver's lock meanwhile)",
                    self.num_blocks,
                )
                return None
            block = self._free.pop()
        weakref.finalize(owner, self._give, block)
        return block

    def _give(self, block: torch.Tensor) -> None:
        with self._lock:
            self._free.append(block)


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
