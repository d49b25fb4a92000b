"""A swapped-out engine's device memory, moved aside and brought back (BasePool's time-share swap).

``DeviceParking.park`` copies the storages of the tensors to keep (the base weights, the LoRA
slots) into one host buffer and frees their device memory; ``unpark`` allocates every storage
again and copies the bytes back: one copy per storage from page-locked memory, non-blocking,
one wait at the end. Tensors keep their identity: views (a layer's rows of a shrink-in-GEMM
weight and the LoRA A factors after them, a tied LM head) see their storage come back at a new
device address, so whatever recorded addresses (CUDA graphs) is made again by the caller.

The host buffer is page-locked once (``cudaHostRegister`` on plain memory, so its size is the
bytes kept, not rounded up to a power of two as torch's pinned allocator does) and kept for the
engine's life: a later park is a device-to-host copy only. It is made again, larger, when the
kept storages outgrow it (adapters' token tables in the slots). Where page-locking fails (a
locked-memory limit) the copies run from pageable memory, slower.

Without ``copy_kept`` (the CPU, whose tensors already live in host memory) the kept tensors
stay where they are and a park frees nothing here.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator

import torch

log = logging.getLogger(__name__)

ALIGN = 4096  # each storage's bytes start at this alignment in the host buffer
PORTABLE = 1  # cudaHostRegisterPortable: page-locked for every device's context (replica sets)


def tensors_of(*roots: object) -> Iterator[torch.Tensor]:
    """Every tensor in ``roots``: tensors, and the fields, items and values of dataclasses,
    lists, tuples and dicts among them (``ModelWeights`` and its layers, quantized weights)."""
    for root in roots:
        if isinstance(root, torch.Tensor):
            yield root
        elif dataclasses.is_dataclass(root) and not isinstance(root, type):
            yield from tensors_of(*(getattr(root, f.name) for f in dataclasses.fields(root)))
        elif isinstance(root, dict):
            yield from tensors_of(*root.values())
        elif isinstance(root, list | tuple):
            yield from tensors_of(*root)


def unique_storages(tensors: Iterable[torch.Tensor]) -> list[torch.UntypedStorage]:
    """The storages under the strided ``tensors``, each once (views and tied tensors share one),
    in order (opaque layouts, oneDNN-packed CPU weights, have none)."""
    found: dict[int, torch.UntypedStorage] = {}
    for tensor in tensors:
        if tensor.layout != torch.strided:
            continue
        storage = tensor.untyped_storage()
        if storage.nbytes() > 0:
            found.setdefault(storage.data_ptr(), storage)
    return list(found.values())


def storage_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over all of ``storage`` ([nbytes])."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


class HostBuffer:
    """``nbytes`` of host memory, page-locked with ``cudaHostRegister`` when ``pin``; ``close``
    unregisters it."""

    def __init__(self, nbytes: int, pin: bool) -> None:
        self.memory = torch.empty(nbytes, dtype=torch.uint8)  # [nbytes]
        self.pinned = False
        if pin and nbytes:
            error = int(torch.cuda.cudart().cudaHostRegister(self.memory.data_ptr(), nbytes, PORTABLE))
            self.pinned = error == 0
            if not self.pinned:
                log.warning(
                    "could not page-lock %.2f GB for a parked base (CUDA error %d); its swaps copy "
                    "from pageable memory, slower", nbytes / 1e9, error,
                )  # fmt: skip

    def close(self) -> None:
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self.memory.data_ptr())
            self.pinned = False


@dataclasses.dataclass
class KeptStorage:
    storage: torch.UntypedStorage
    offset: int  # where its bytes lie in the host buffer
    nbytes: int


class DeviceParking:
    """Park and unpark the device memory of one engine (its worker thread only)."""

    def __init__(self, device: torch.device, copy_kept: bool) -> None:
        self.device = device
        self.copy_kept = copy_kept
        self.host: HostBuffer | None = None
        self.kept: list[KeptStorage] = []
        self.parked = False

    @staticmethod
    def kept_bytes(keep: Iterable[torch.Tensor]) -> int:
        """Bytes a park of ``keep`` holds in host memory (each storage once)."""
        tensors = list(keep)
        opaque = sum(t.nbytes for t in tensors if t.layout != torch.strided)
        return opaque + sum(storage.nbytes() for storage in unique_storages(tensors))

    @torch.inference_mode()
    def park(self, keep: Iterable[torch.Tensor]) -> None:
        """Copy ``keep``'s storages to host memory and free them on the device (into the caching
        allocator: the caller empties its cache); ValueError, with nothing changed, for tensors
        that cannot be moved."""
        if self.parked:
            raise RuntimeError("the engine's device memory is parked already")
        self._synchronize()  # every step that reads or writes them has finished (uploads: the caller)
        kept: list[torch.UntypedStorage] = []
        if self.copy_kept:
            tensors = list(keep)
            if any(t.layout != torch.strided for t in tensors):
                raise ValueError("tensors in an opaque layout (oneDNN-packed weights) cannot be parked")
            kept = unique_storages(tensors)
            if not all(storage.resizable() for storage in kept):  # shared with NumPy (CPU kernels)
                raise ValueError("tensors whose memory is shared with NumPy cannot be parked")
        layout, total = [], 0
        for storage in kept:
            layout.append(KeptStorage(storage, total, storage.nbytes()))
            total += aligned(storage.nbytes())
        if kept and (self.host is None or self.host.memory.numel() < total):
            if self.host is not None:
                self.host.close()
            self.host = HostBuffer(total, pin=self.device.type == "cuda")
        for entry in layout:
            assert self.host is not None  # made above for any kept storage
            target = self.host.memory[entry.offset : entry.offset + entry.nbytes]  # [nbytes]
            target.copy_(storage_bytes(entry.storage), non_blocking=True)
        self._synchronize()  # the host copies are complete before their source is freed
        for entry in layout:
            entry.storage.resize_(0)
        self.kept = layout
        self.parked = True

    @torch.inference_mode()
    def unpark(self) -> None:
        """Allocate every parked storage again and copy its bytes back."""
        if not self.parked:
            raise RuntimeError("the engine's device memory is not parked")
        for entry in self.kept:
            assert self.host is not None
            entry.storage.resize_(entry.nbytes)
            source = self.host.memory[entry.offset : entry.offset + entry.nbytes]  # [nbytes]
            storage_bytes(entry.storage).copy_(source, non_blocking=True)
        self._synchronize()  # the weights are in place before any step reads them
        self.kept = []
        self.parked = False

    def close(self) -> None:
        """Give the host buffer back (the engine is stopping)."""
        if self.host is not None:
            self.host.close()
            self.host = None

    def _synchronize(self) -> None:
        """Wait for this thread's stream (the worker's steps and these copies)."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
