"""Which adapters hold the GPU slots, and what brings the others there: disk loads into the host
tier and uploads into slots.

Thread contract: every method runs on the engine's worker thread, the only one that touches the
slots' device tensors: the scheduler asks :meth:`WorkerTierManager.acquire` whether a waiting
request's adapter holds a slot (starting the disk load or the slot upload it needs), and the
worker tells it which adapters queued and running requests use (:meth:`want` /
:meth:`unwant`), so a load never evicts an adapter that a request waits for. Other threads reach
it through the worker's commands only; what they may ask directly is in
``ThreadSafeAdapterCatalog``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable

import torch

from multilora_studio.adapters.load_latency import TierCounters
from multilora_studio.adapters.slot_table import SlotTable
from multilora_studio.engine.batch.scheduler import Admission
from multilora_studio.engine.config import EngineConfig
from multilora_studio.engine.model.lora_weights import LoRASlotWeights, PackedAdapter
from multilora_studio.engine.residency.adapter_catalog import ThreadSafeAdapterCatalog
from multilora_studio.engine.residency.upload_staging import UploadStager

log = logging.getLogger(__name__)


class WorkerTierManager:
    """The worker's side of the adapter tiers: GPU slots, uploads, and the loads requests wait for."""

    def __init__(
        self,
        config: EngineConfig,
        catalog: ThreadSafeAdapterCatalog,
        lora: LoRASlotWeights,
        device: torch.device,
        dtype: torch.dtype,
        wake: Callable[[], None],
    ) -> None:
        self.config = config
        self.catalog = catalog
        self.host_tier = catalog.host_tier
        self.lora = lora
        self._wanted: Counter[str | None] = Counter()  # adapter -> its queued and running requests
        self.slots = SlotTable(config.max_loras)
        # Adapters of queued requests that were on disk when they arrived, in arrival order:
        # read into the host tier ahead of admission (``look_ahead``).
        self._lookahead: deque[str] = deque()
        self.upload_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        # Slot uploads in flight: the event that completes them, and the host copy they read
        # (kept alive, with its pinned block, until the copies have completed).
        self._uploads: dict[str, tuple[torch.cuda.Event, PackedAdapter, torch.cuda.Event]] = {}
        self.upload_counters = TierCounters()  # host RAM -> GPU slot: each upload's seconds
        self._pinned_loads: set[str] = set()  # pinned adapters on their way into a slot
        arena = self.host_tier.arena
        # Pinned copies of pageable host-tier adapters for their uploads (CUDA)
        self.stager = UploadStager(arena, dtype, wake) if arena is not None else None
        self.gpu_hits = 0
        self.gpu_misses = 0  # counted when an upload starts

    def tier_of(self, name: str | None) -> str | None:
        """Where ``name``'s weights are now, one of ``ADAPTER_TIERS``: "gpu" (a slot), "host" (the
        host tier), "loading" (a disk read in flight) or "disk"; None for the base model."""
        if name is None:
            return None
        if self.slots.slot_of(name) is not None:
            return "gpu"
        cache = self.host_tier.cache
        if cache.holds(name):
            return "host"
        return "loading" if cache.loading(name) else "disk"

    # ---------------------------------------------------------------- the requests' adapters

    def want(self, name: str | None) -> None:
        """A request for ``name`` was queued."""
        self._wanted[name] += 1
        if name is not None and self.tier_of(name) == "disk":
            self._lookahead.append(name)

    def look_ahead(self) -> None:
        """Read the adapters of queued requests into the host tier in arrival order, before
        their requests are admitted, while loaders are free and the tier has room that no
        queued or running request's adapter holds (S-LoRA's prefetch for the queue).

        Each queued adapter is looked at once here: the cost follows the loads, not the queue.
        """
        host = self.host_tier.cache
        while self._lookahead and host.loads_in_flight < self.host_tier.load_workers:
            name = self._lookahead[0]
            if name not in self._wanted or self.tier_of(name) != "disk":
                self._lookahead.popleft()  # served, loaded or loading meanwhile
                continue
            victim = host.eviction_candidate()
            if victim is not None and victim in self._wanted:
                return  # the tier is full of adapters that requests wait for: wait for room
            self._lookahead.popleft()
            info = self.catalog.info_of(name)
            if info is not None and host.error_of(name) is None:
                host.lookup(name, info.path)

    def unwant(self, name: str | None) -> None:
        """A request for ``name`` finished."""
        self._wanted[name] -= 1
        if not self._wanted[name]:
            del self._wanted[name]

    def acquire(self, name: str | None) -> Admission:
        """Give a request its adapter's slot, or say why it must wait (the scheduler's gate).

        A disk load starts as soon as a request for the adapter waits, also while no slot
        is free (then at most ``load_workers`` such loads at once). A slot miss starts an upload from
        the host tier (on a side CUDA stream, so running requests keep decoding); the upload
        holds the slot until its event has completed.
        """
        if name is None:
            return Admission.READY
        if self.slots.slot_of(name) is not None:
            upload = self._uploads.get(name)
            if upload is not None:
                if not upload[0].query():
                    return Admission.LOADING
                del self._uploads[name]  # the end of a miss, counted when the upload started
                self.upload_counters.record(name, upload[2].elapsed_time(upload[0]) / 1000.0)
                self.slots.release(name)
            else:
                self.gpu_hits += 1
            return Admission.READY if self.slots.acquire(name) is not None else Admission.NO_SLOT
        info = self.catalog.info_of(name)
        if info is None:
            return Admission.LOADING  # not reached: removal is refused while requests for it wait
        host = self.host_tier.cache
        if not self.slots.can_acquire(name):
            # No slot now: read the adapter into host RAM meanwhile, a few loads at a time
            # (the same number the loader runs at once) and never in place of an adapter that
            # another request waits for, so the upload can start as soon as a slot frees.
            if host.loading(name):
                return Admission.LOADING
            if host.holds(name) or host.loads_in_flight >= self.host_tier.load_workers:
                return Admission.NO_SLOT
            victim = host.eviction_candidate()
            if victim is not None and victim in self._wanted:
                return Admission.NO_SLOT  # it would push out an adapter that a request waits for
            host.lookup(name, info.path)
            return Admission.LOADING
        packed = host.lookup(name, info.path)
        if packed is None:
            return Admission.LOADING
        if self.upload_stream is not None and not packed.pinned and self.stager is not None:
            staged = self.stager.staged(packed)  # pageable: copied into a pinned block first
            if staged is None:
                return Admission.LOADING
            packed = staged
        if packed.tokens is not None and not self._make_table_room(packed.tokens.nbytes):
            return Admission.NO_SLOT
        acquired = self.slots.acquire(name)
        if acquired is None:
            return Admission.NO_SLOT
        self.gpu_misses += 1
        if acquired.evicted is not None:
            log.debug("slot %d: %s evicted for %s", acquired.slot, acquired.evicted, name)
        if self.upload_stream is None:
            started = time.perf_counter()
            self.lora.upload(acquired.slot, packed)
            self.upload_counters.record(name, time.perf_counter() - started)
            return Admission.READY
        with torch.cuda.stream(self.upload_stream):
            start = torch.cuda.Event(enable_timing=True)
            start.record(self.upload_stream)
            self.lora.upload(acquired.slot, packed)
            done = torch.cuda.Event(enable_timing=True)
            done.record(self.upload_stream)
        self._uploads[name] = (done, packed, start)  # keeps the slot until the copy has finished
        return Admission.LOADING

    def _make_table_room(self, nbytes: int) -> bool:
        """Evict idle adapters with token tables until tables of ``nbytes`` fit the pool; False
        when they cannot (the others are in use or pinned: the request waits)."""
        pool = self.lora.token_tables
        while not pool.has_room(nbytes, slot=-1):
            holders = [name for name, slot in self.slots.evictable() if slot in pool.tables]
            if not holders:
                return False
            slot = self.slots.evict(holders[0])  # the least recently used
            assert slot is not None
            self.lora.clear(slot)
        return True

    def release(self, name: str | None) -> None:
        """A running request for ``name`` left the batch."""
        if name is not None:
            self.slots.release(name)

    # ---------------------------------------------------------------- uploads and loads

    @property
    def uploads_in_flight(self) -> int:
        return len(self._uploads)

    def finish_uploads(self) -> None:
        """Wait for the slot uploads in flight to land (before the slots are parked)."""
        if self.upload_stream is not None:
            self.upload_stream.synchronize()

    def take_failed_loads(self) -> list[str]:
        """The adapters whose load into the host tier failed since the last call."""
        return self.host_tier.cache.take_failures()

    def load_error(self, name: str) -> Exception | None:
        """Why ``name`` could not be read into the host tier, if it could not."""
        return self.host_tier.cache.error_of(name)

    # ---------------------------------------------------------------- commands: remove, pin

    def remove(self, name: str) -> None:
        """Forget ``name``, its slot and host copy; refused while requests for it wait or run."""
        self.catalog.require(name)
        users = self._wanted[name]
        if users:
            raise ValueError(f"adapter {name!r} is used by {users} queued or running requests")
        upload = self._uploads.pop(name, None)
        if upload is not None:
            upload[0].synchronize()
            self.slots.release(name)
        slot = self.slots.evict(name)
        if slot is not None:
            self.lora.clear(slot)
        host = self.host_tier.cache
        host.discard(name)
        host.counters.adapters.forget(name)
        self.upload_counters.adapters.forget(name)
        self._pinned_loads.discard(name)
        if self.stager is not None:
            self.stager.forget(name)
        self.catalog.forget(name)

    def pin(self, name: str, pinned: bool) -> None:
        """Pin ``name`` and bring it into a slot now (``load_pinned``), or unpin it."""
        info = self.catalog.require(name)
        if pinned and info.tokens and not self.slots.is_pinned(name):
            holders = sum(1 for i in self.catalog.infos() if i.tokens and self.slots.is_pinned(i.name))
            limit = self.config.max_token_tables - 1
            if holders >= limit:
                raise ValueError(
                    f"cannot pin {name!r}: at most {limit} adapters with token tables can be pinned "
                    f"(max_token_tables={self.config.max_token_tables}, so that the others can still run)"
                )
        (self.slots.pin if pinned else self.slots.unpin)(name)
        if pinned and self.slots.slot_of(name) is None:
            self._pinned_loads.add(name)
        else:
            self._pinned_loads.discard(name)

    def pinned(self) -> list[str]:
        """The adapters pinned, in a slot or on their way into one."""
        return sorted(self.slots.pinned_names())

    def load_pinned(self) -> bool:
        """Advance the loads of pinned adapters into their slots; True while some are on their way.

        Each goes through ``acquire`` like a request's adapter (disk -> host tier -> slot) and lets
        go of the slot once it is there; being pinned, it stays.
        """
        for name in list(self._pinned_loads):
            if self.acquire(name) is Admission.READY:
                self.release(name)
                self._pinned_loads.discard(name)
        return bool(self._pinned_loads)

    def close(self) -> None:
        """Stop the stager threads (after the worker has ended)."""
        if self.stager is not None:
            self.stager.close()
