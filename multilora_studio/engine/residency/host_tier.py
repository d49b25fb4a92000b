"""The host-RAM tier of one engine's adapters: their packed copies, the loads from disk that
fill it (on loader threads, or in loader children), and the pinned arena the copies live in.

Thread contract: thread-safe. The catalog preloads and prefetches into it from its callers'
threads, the worker starts the loads its requests need, and the loads run on loader threads;
``HostAdapterCache`` guards the copies, ``PinnedArena`` its blocks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import torch

from multilora_studio.adapters.host_cache import HostAdapterCache
from multilora_studio.adapters.peft_adapter import HostAdapter, load_peft_adapter
from multilora_studio.engine.config import EngineConfig
from multilora_studio.engine.model.lora_weights import PackedAdapter
from multilora_studio.engine.model.model_spec import ModelSpec
from multilora_studio.engine.residency.adapter_packing import max_packed_bytes, pack_adapter
from multilora_studio.engine.residency.host_threads import loader_threads
from multilora_studio.engine.residency.host_tier_size import available_host_memory, host_tier_capacity
from multilora_studio.engine.residency.loader_process import LoaderProcess, staging_buffers_that_fit
from multilora_studio.engine.residency.pinned_arena import PinnedArena

log = logging.getLogger(__name__)

STAGING_BLOCKS = 2  # pinned blocks kept free to stage uploads of adapters in pageable memory


class HostTier:
    """Packed adapters in host RAM (LRU, ``capacity`` of them) and the loads that bring them."""

    def __init__(
        self,
        config: EngineConfig,
        spec: ModelSpec,
        device: torch.device,
        dtype: torch.dtype,
        wake: Callable[[], None],
        has_token_tables: Callable[[str], bool],
    ) -> None:
        self.config = config
        self.spec = spec
        self.device = device
        self.dtype = dtype
        self._has_token_tables = has_token_tables
        # host bytes of one adapter of max_lora_rank on every projection: a pinned block, a staging buffer
        block_bytes = max_packed_bytes(spec, config.max_lora_rank, dtype)
        self.loader, self.load_workers = self._choose_loader(block_bytes)
        self.capacity = host_tier_capacity(config, block_bytes, available_host_memory())
        self.cache: HostAdapterCache[PackedAdapter] = HostAdapterCache(
            self.capacity, self._load, wake, self.load_workers
        )
        self.arena = self._pinned_arena(block_bytes, self.capacity)
        self._loader_process: LoaderProcess | None = None
        if self.loader == "process":
            self._loader_process = LoaderProcess(
                spec, config.max_lora_rank, dtype, block_bytes, self.load_workers
            )

    def _choose_loader(self, staging_bytes: int) -> tuple[str, int]:
        """("thread" or "process", loads at once): as configured, with no more loader children
        than staging buffers fit in shared memory (none: threads)."""
        config, device_type = self.config, self.device.type
        loader, workers = config.loader_for(device_type), config.load_workers_for(device_type)
        if loader == "process":
            fitting = staging_buffers_that_fit(staging_bytes, workers)
            if fitting > 0:
                return loader, fitting
            log.warning("no room in shared memory for an adapter staging buffer; loading on threads")
        return "thread", workers

    def _pinned_arena(self, block_bytes: int, host_slots: int) -> PinnedArena | None:
        """Pinned blocks of ``block_bytes`` for the host tier on CUDA: for its most recent
        adapters (up to twice the GPU slots), one per load in flight, one for an upload in
        flight and ``STAGING_BLOCKS`` for staging the uploads of the tier's other adapters,
        which stay in pageable memory (pinning more would stall steps or the start)."""
        if self.device.type != "cuda":
            return None
        pinned_adapters = min(host_slots, 2 * self.config.max_loras)
        return PinnedArena.for_tier(block_bytes, pinned_adapters + self.load_workers + 1 + STAGING_BLOCKS)

    # ---------------------------------------------------------------- loads (loader threads, any thread)

    def _read(self, name: str, path: Path) -> HostAdapter:
        spec = self.spec
        return load_peft_adapter(
            name,
            path,
            spec.num_layers,
            spec.projection_shape,
            self.config.max_lora_rank,
            spec.vocab,
            dtype=self.dtype,
        )

    def _load(self, name: str, path: Path) -> PackedAdapter:
        """Disk -> host tier: validate, then lay out in slot format (pinned for fast uploads)."""
        with loader_threads(self.device.type):
            # token tables (up to GBs) do not fit the children's staging buffers: read here
            if self._loader_process is not None and not self._has_token_tables(name):
                return self._loader_process.load(name, path, self.arena, STAGING_BLOCKS)
            return self._pack(self._read(name, path))

    def read_and_pack(self, name: str, path: Path) -> tuple[HostAdapter, PackedAdapter]:
        """``name``'s weights read and packed on the calling thread (an ``add`` that preloads)."""
        with loader_threads(self.device.type):
            host = self._read(name, path)
            return host, self._pack(host)

    def _pack(self, adapter: HostAdapter) -> PackedAdapter:
        pin = self.device.type == "cuda"
        return pack_adapter(adapter, self.spec, self.dtype, pin=pin, arena=self.arena, keep=STAGING_BLOCKS)

    def prefetch(self, paths: dict[str, Path], timeout: float | None) -> dict[str, str | None]:
        """Load each adapter of ``paths`` (name -> folder) and wait for them; see
        ``Engine.prefetch_adapters``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        outcome: dict[str, str | None] = {}
        while len(outcome) < len(paths):
            for name, path in paths.items():
                if name in outcome:
                    continue
                if self.cache.get(name) is not None:
                    outcome[name] = None
                elif (error := self.cache.error_of(name)) is not None:
                    outcome[name] = str(error)
                else:
                    self.cache.lookup(name, path)  # starts its load unless one is running
            if len(outcome) < len(paths):
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"prefetching {len(paths)} adapters took longer than {timeout} s")
                time.sleep(0.005)
        return outcome

    def close(self) -> None:
        """Stop the loader threads and children."""
        self.cache.close()
        if self._loader_process is not None:
            self._loader_process.close()
