"""Adapter loads in a child process (``EngineConfig(adapter_loader="process")``).

Reading, validating and packing an adapter is thousands of small torch operations and
Python between them; on the loader thread they share the GIL with the engine's worker
thread, which needs it between every launch of a decode step. Here they run in a spawned
child process that writes the packed adapter into a shared-memory staging buffer; the
engine's loader thread only copies the buffer's used bytes into the adapter's host memory
(one copy, during which it does not hold the GIL) and builds views.

Up to ``workers`` loads at once (one per loader thread of the host tier), in as many
children, each load in a staging buffer of its own taken from a free list. A child that
dies fails the loads it was running with a clear error; the next load starts new children.
"""

from __future__ import annotations

import logging
import multiprocessing
import queue
import shutil
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import torch

from multilora_studio.adapters.peft_adapter import AdapterError, load_peft_adapter
from multilora_studio.engine.model.lora_weights import PackedAdapter
from multilora_studio.engine.model.model_spec import ModelSpec
from multilora_studio.engine.residency.adapter_packing import pack_adapter
from multilora_studio.engine.residency.pinned_arena import PinnedArena, carve
from multilora_studio.spawned import main_module_hidden

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StagedAdapter:
    """What the child sends back: where each packed tensor lies in the staging buffer."""

    name: str
    rank: int
    groups: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]  # a then b per group, in ``groups`` order, then the rows
    used_bytes: int
    row_keys: tuple[str, ...] = ()  # PackedAdapter.rows keys, in ``shapes`` order after the groups


class _StagingBlock:
    """Hands the staging buffer to ``pack_adapter`` as a one-block arena."""

    pin = False

    def __init__(self, block: torch.Tensor) -> None:
        self.block = block
        self.block_bytes = block.numel()

    def take(self, owner: object, keep: int = 0) -> torch.Tensor:
        return self.block


@dataclass
class _Child:
    """What the child process keeps between loads (set by its initializer)."""

    memories: list[shared_memory.SharedMemory]
    staging: list[_StagingBlock]
    spec: ModelSpec
    max_rank: int
    dtype: torch.dtype


_CHILD: dict[str, _Child] = {}  # "state" in the child process, set by its initializer


def _child_init(staging_names: tuple[str, ...], spec: ModelSpec, max_rank: int, dtype: torch.dtype) -> None:
    torch.set_num_threads(1)  # small, memory-bound operations; leave the cores to the engine
    memories = [shared_memory.SharedMemory(name=name) for name in staging_names]
    staging = [_StagingBlock(torch.frombuffer(memory.buf, dtype=torch.uint8)) for memory in memories]
    _CHILD["state"] = _Child(memories, staging, spec, max_rank, dtype)


def _child_ready() -> bool:
    return True


def _child_load(name: str, path: str, index: int) -> StagedAdapter:
    child = _CHILD["state"]
    spec, dtype, staging = child.spec, child.dtype, child.staging[index]
    block = staging.block
    layers, shape_of = spec.num_layers, spec.projection_shape
    host = load_peft_adapter(name, Path(path), layers, shape_of, child.max_rank, spec.vocab, dtype=dtype)
    packed = pack_adapter(host, spec, dtype, pin=False, arena=staging)
    groups, row_keys = tuple(packed.a), tuple(packed.rows)
    tensors = [t for g in groups for t in (packed.a[g], packed.b[g])] + [packed.rows[k] for k in row_keys]
    if any(t.untyped_storage().data_ptr() != block.untyped_storage().data_ptr() for t in tensors):
        raise AdapterError(f"{path}: the packed adapter does not fit the staging buffer")
    end = max(t.data_ptr() + t.numel() * t.element_size() for t in tensors) - block.data_ptr()
    return StagedAdapter(name, packed.rank, groups, tuple(tuple(t.shape) for t in tensors), end, row_keys)


class _SpawnContext(multiprocessing.context.SpawnContext):
    """The spawn context, keeping the processes the pool starts with it: a pool's shutdown
    waits for children still importing torch (seconds each, on a busy host tens of seconds);
    ``LoaderProcess.close`` ends them instead."""

    def __init__(self) -> None:
        self.children: list[multiprocessing.context.SpawnProcess] = []

    def Process(  # type: ignore[override]  # the pool calls its context's Process
        self, *args: Any, **kwargs: Any
    ) -> multiprocessing.context.SpawnProcess:
        child = multiprocessing.context.SpawnProcess(*args, **kwargs)
        self.children.append(child)
        return child


def staging_buffers_that_fit(nbytes: int, wanted: int) -> int:
    """How many of ``wanted`` staging buffers of ``nbytes`` fit in free shared memory (/dev/shm
    in containers is often small; a child writing past it would die of SIGBUS)."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        return wanted
    free = shutil.disk_usage(shm).free
    usable = free - min(64 << 20, free // 8)  # room left for everyone else
    return max(0, min(wanted, usable // max(1, nbytes)))


class LoaderProcess:
    """Loads adapters for one engine in spawned children; call ``load`` from up to ``workers``
    threads at once."""

    def __init__(
        self, spec: ModelSpec, max_rank: int, dtype: torch.dtype, staging_bytes: int, workers: int = 1
    ) -> None:
        self.spec = spec
        self.max_rank = max_rank
        self.dtype = dtype
        self.workers = workers
        self._memories = [shared_memory.SharedMemory(create=True, size=staging_bytes) for _ in range(workers)]
        self._staging = [torch.frombuffer(m.buf, dtype=torch.uint8) for m in self._memories]
        self._free: queue.SimpleQueue[int] = queue.SimpleQueue()  # staging buffers not in use
        for index in range(workers):
            self._free.put(index)
        self._restart_lock = threading.Lock()
        self._pool = self._start()

    def _start(self) -> ProcessPoolExecutor:
        self._context = _SpawnContext()
        pool = ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=self._context,
            initializer=_child_init,
            initargs=(tuple(m.name for m in self._memories), self.spec, self.max_rank, self.dtype),
        )
        with main_module_hidden():
            for _ in range(self.workers):  # start every child now (each imports torch, ~3 s),
                pool.submit(_child_ready)  # not during the first burst of loads
        return pool

    def load(self, name: str, path: Path, arena: PinnedArena | None, keep: int) -> PackedAdapter:
        """Read, validate and pack ``path`` in a child; the result in a block of ``arena`` while
        more than ``keep`` are free, else in new pageable memory."""
        index = self._free.get()
        try:
            return self._load_in(index, name, path, arena, keep)
        finally:
            self._free.put(index)

    def _load_in(
        self, index: int, name: str, path: Path, arena: PinnedArena | None, keep: int
    ) -> PackedAdapter:
        pool = self._pool
        try:
            staged = pool.submit(_child_load, name, str(path), index).result()
        except BrokenProcessPool:
            with self._restart_lock:
                if self._pool is pool:  # the first of the loads that saw it die restarts
                    log.warning("an adapter loader process died; starting new ones")
                    pool.shutdown(wait=False, cancel_futures=True)
                    self._pool = self._start()
            raise AdapterError(f"{path}: the adapter loader process died while reading it") from None
        packed = PackedAdapter(staged.name, staged.rank, {}, {})
        fits = arena is not None and staged.used_bytes <= arena.block_bytes
        block = arena.take(packed, keep) if arena is not None and fits else None
        packed.pinned = block is not None and arena is not None and arena.pin
        if block is None:
            block = torch.empty(staged.used_bytes, dtype=torch.uint8)
        block[: staged.used_bytes].copy_(self._staging[index][: staged.used_bytes])
        tensors = carve(block, list(staged.shapes), self.dtype, zero=False)
        for g, group in enumerate(staged.groups):
            packed.a[group], packed.b[group] = tensors[2 * g], tensors[2 * g + 1]
        packed.rows = dict(zip(staged.row_keys, tensors[2 * len(staged.groups) :], strict=True))
        return packed

    def close(self) -> None:
        """End the children at once (a load in flight is abandoned) and free the staging buffers."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        for child in self._context.children:
            child.terminate()
        for child in self._context.children:
            child.join()
        self._staging.clear()
        for memory in self._memories:
            memory.close()
            memory.unlink()
