"""Where each adapter lives: the adapters added, the GPU slots, the host tier and uploads.

Any thread may add, list and prefetch adapters. The worker thread owns the rest: the
scheduler asks :meth:`AdapterResidency.acquire` whether a waiting request's adapter holds a
slot (starting the disk load or the slot upload it needs), and the worker tells it which
adapters queued and running requests use (:meth:`want` / :meth:`unwant`), so a load never
evicts an adapter that a request waits for.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from multilora_studio.adapters.adapter_tokenizer import AdapterTokenizer, adapter_tokenizer
from multilora_studio.adapters.host_cache import HostAdapterCache
from multilora_studio.adapters.load_latency import TierCounters
from multilora_studio.adapters.peft_adapter import HostAdapter, inspect_peft_adapter, load_peft_adapter
from multilora_studio.adapters.short_lived_workers import call_on_short_lived_thread
from multilora_studio.adapters.slot_table import SlotTable
from multilora_studio.engine.chat_tokens import Render, render_in_process
from multilora_studio.engine.config import EngineConfig
from multilora_studio.engine.errors import UnknownAdapter
from multilora_studio.engine.host_threads import loader_threads
from multilora_studio.engine.host_tier_size import available_host_memory, host_tier_capacity
from multilora_studio.engine.loader_process import LoaderProcess, staging_buffers_that_fit
from multilora_studio.engine.lora_weights import (
    LoRASlotWeights,
    PackedAdapter,
    max_packed_bytes,
    pack_adapter,
)
from multilora_studio.engine.model_spec import ModelSpec
from multilora_studio.engine.pinned_arena import PinnedArena, carve
from multilora_studio.engine.scheduler import Admission
from multilora_studio.engine.template_sandbox import TemplateSandbox
from multilora_studio.invalid_setting import InvalidSetting

log = logging.getLogger(__name__)

STAGING_BLOCKS = 2  # pinned blocks kept free to stage uploads of adapters in pageable memory
ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")


@dataclass(frozen=True)
class AdapterInfo:
    name: str
    path: Path
    rank: int
    alpha: float
    targets: tuple[str, ...]
    size_bytes: int
    kind: str = "LoRA"  # AdapterConfig.kind: "DoRA", "LoRA with bias" or "LoRA"
    tokens: str = ""  # the embedding / LM-head rows it replaces (TokenTablePlan.label), or ""
    tokenizer: str = ""  # AdapterTokenizer.label ("own tokenizer / template", ...), or ""
    vocab_size: int = 0  # its vocabulary (the base's unless it adds tokens)
    table_bytes: int = 0  # its whole embed_tokens / lm_head matrices on the device


class AdapterResidency:
    """The adapters of one engine and their tiers: GPU slots, pinned host RAM, disk."""

    def __init__(
        self,
        config: EngineConfig,
        spec: ModelSpec,
        model_name: str,
        lora: LoRASlotWeights,
        device: torch.device,
        dtype: torch.dtype,
        wake: Callable[[], None],
        base_tokenizer: Any = None,
    ) -> None:
        self.config = config
        self.spec = spec
        self.model_name = model_name
        self.lora = lora
        self.device = device
        self.dtype = dtype
        self._lock = threading.Lock()  # guards _adapters (any thread)
        self._adapters: dict[str, AdapterInfo] = {}
        self._tokenizers: dict[str, AdapterTokenizer] = {}  # adapters with their own (any thread)
        self.base_tokenizer = base_tokenizer
        self.template_sandbox = TemplateSandbox(config.max_model_len)  # their chat templates
        self._wanted: Counter[str | None] = Counter()  # adapter -> its queued and running requests
        self.slots = SlotTable(config.max_loras)
        # host bytes of one adapter of max_lora_rank on every projection: a pinned block, a staging buffer
        block_bytes = max_packed_bytes(spec, config.max_lora_rank, dtype)
        self.loader, self.load_workers = self._choose_loader(block_bytes)
        self.host_capacity = host_tier_capacity(config, block_bytes, available_host_memory())
        self.host_cache: HostAdapterCache[PackedAdapter] = HostAdapterCache(
            self.host_capacity, self._load, wake, self.load_workers
        )
        # Adapters of queued requests that were on disk when they arrived, in arrival order:
        # read into the host tier ahead of admission (``look_ahead``).
        self._lookahead: deque[str] = deque()
        self.upload_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        # Slot uploads in flight: the event that completes them, and the host copy they read
        # (kept alive, with its pinned block, until the copies have completed).
        self._uploads: dict[str, tuple[torch.cuda.Event, PackedAdapter, torch.cuda.Event]] = {}
        self.upload_counters = TierCounters()  # host RAM -> GPU slot: each upload's seconds
        self._pinned_loads: set[str] = set()  # pinned adapters on their way into a slot
        self.arena = self._pinned_arena(block_bytes, self.host_capacity)
        self._wake = wake
        # Pinned copies of pageable host-tier adapters for their uploads (CUDA): adapter -> copy
        self._stager = ThreadPoolExecutor(max_workers=2, thread_name_prefix="adapter-stager")
        self._staging: dict[str, Future[PackedAdapter]] = {}
        self._loader_process: LoaderProcess | None = None
        if self.loader == "process":
            self._loader_process = LoaderProcess(
                spec, config.max_lora_rank, dtype, block_bytes, self.load_workers
            )
        self.gpu_hits = 0
        self.gpu_misses = 0  # counted when an upload starts

    # ---------------------------------------------------------------- loading (loader threads)

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
            with self._lock:
                info = self._adapters.get(name)
            # token tables (up to GBs) do not fit the children's staging buffers: read here
            if self._loader_process is not None and not (info is not None and info.tokens):
                return self._loader_process.load(name, path, self.arena, STAGING_BLOCKS)
            return self._pack(self._read(name, path))

    def _read_and_pack(self, name: str, path: Path) -> tuple[HostAdapter, PackedAdapter]:
        with loader_threads(self.device.type):
            host = self._read(name, path)
            return host, self._pack(host)

    def _pack(self, adapter: HostAdapter) -> PackedAdapter:
        pin = self.device.type == "cuda"
        return pack_adapter(adapter, self.spec, self.dtype, pin=pin, arena=self.arena, keep=STAGING_BLOCKS)

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

    def _staged(self, packed: PackedAdapter) -> PackedAdapter | None:
        """A pinned copy of ``packed`` (held in pageable memory) for its upload, made on a stager
        thread; None while it is being made, or while no pinned block is free."""
        future = self._staging.get(packed.name)
        if future is None:
            if self.arena is None or not self.arena.free_blocks:
                return None  # every block is in use: asked again on the next turn (not counted)
            staged = PackedAdapter(packed.name, packed.rank, {}, {}, pinned=True)
            block = self.arena.take(staged)
            if block is None:
                return None
            future = self._stager.submit(stage_copy, packed, staged, block, self.dtype)
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

    # ---------------------------------------------------------------- the adapters added (any thread)

    def add(self, name: str, path: str | Path, preload: bool) -> AdapterInfo:
        """See ``Engine.add_adapter``."""
        if not isinstance(name, str) or not ADAPTER_NAME.match(name) or name in ("base", self.model_name):
            raise ValueError(
                f"invalid adapter name {name!r}: use 1-128 letters, digits or ._:/@+- "
                "(and not 'base' or the base model's name)"
            )
        with self._lock:
            if name in self._adapters:
                raise ValueError(f"an adapter named {name!r} already exists; remove it first")
        path = Path(path)
        spec = self.spec
        summary = inspect_peft_adapter(
            path, spec.num_layers, spec.projection_shape, self.config.max_lora_rank, spec.vocab
        )
        self._check_table_budget(path, summary.table_values * self.dtype.itemsize, bool(summary.tokens))
        vocab_size = summary.vocab_size or spec.vocab_size
        tokenizer = adapter_tokenizer(path, self.base_tokenizer, vocab_size)
        info = AdapterInfo(
            name, path, summary.rank, summary.alpha, summary.targets, summary.size_bytes, summary.kind,
            summary.tokens, tokenizer.label if tokenizer is not None else "", vocab_size,
            summary.table_values * self.dtype.itemsize,
        )  # fmt: skip
        packed = None
        if preload:
            # On a thread that ends with the load: see adapters/short_lived_workers.py.
            host, packed = call_on_short_lived_thread(lambda: self._read_and_pack(name, path))
            info = dataclasses.replace(info, size_bytes=host.nbytes)
        with self._lock:
            if name in self._adapters:
                raise ValueError(f"an adapter named {name!r} already exists; remove it first")
            self._adapters[name] = info
            if tokenizer is not None:
                self._tokenizers[name] = tokenizer
        if tokenizer is not None:
            self.template_sandbox.warm()  # its first chat need not wait for a renderer to start
        if packed is not None:
            self.host_cache.put(packed)
        return info

    def infos(self) -> list[AdapterInfo]:
        with self._lock:
            return list(self._adapters.values())

    def has(self, name: str) -> bool:
        with self._lock:
            return name in self._adapters

    def _check_table_budget(self, path: Path, table_bytes: int, has_tables: bool) -> None:
        """ValueError when the adapter's token tables could never fit the device's pool."""
        config = self.config
        if has_tables and config.max_token_tables == 0:
            raise InvalidSetting(
                "{path} replaces embedding / lm_head rows, and {max_token_tables} is 0",
                {"max_token_tables": 0},
                {"path": path},
            )
        limit = int(config.token_table_memory_gb * (1 << 30))
        if table_bytes > limit:
            raise InvalidSetting(
                "{path}: its embed_tokens / lm_head tables take {gib:.2f} GiB, more than "
                "{token_table_memory_gb:=}; raise it to serve this adapter",
                {"token_table_memory_gb": f"{config.token_table_memory_gb:g}"},
                {"path": path, "gib": table_bytes / 2**30},
            )

    def tokenizer_of(self, name: str | None) -> AdapterTokenizer | None:
        """The adapter's own tokenizer / template (None: it uses the base's)."""
        if name is None:
            return None
        with self._lock:
            return self._tokenizers.get(name)

    def renderer_of(self, name: str | None) -> Render:
        """How ``name``'s chat template renders: in the sandbox when the adapter brings its own
        tokenizer or template, here for the base model's."""
        if self.tokenizer_of(name) is None:
            return render_in_process
        return self.template_sandbox.render

    def vocab_size_of(self, name: str | None) -> int:
        """The vocabulary of ``name``'s rows (the base's for None or an adapter that adds none)."""
        if name is None:
            return self.spec.vocab_size
        with self._lock:
            info = self._adapters.get(name)
        return info.vocab_size if info is not None and info.vocab_size else self.spec.vocab_size

    def kind_of(self, name: str) -> str:
        """The added adapter's kind (``AdapterInfo.kind``)."""
        with self._lock:
            return self._adapters[name].kind

    def check_known(self, name: str) -> None:
        """Raise UnknownAdapter, naming the adapters there are, unless ``name`` was added."""
        with self._lock:
            if name in self._adapters:
                return
            names = sorted(self._adapters)
        known = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
        raise UnknownAdapter(f"unknown adapter {name!r} (known: {known or 'none'})")

    def prefetch(self, names: Sequence[str], timeout: float | None) -> dict[str, str | None]:
        """See ``Engine.prefetch_adapters``."""
        capacity = self.host_cache.capacity
        if len(names) > capacity:
            raise InvalidSetting(
                "{count} adapters do not fit the host tier of {capacity} ({max_cpu_loras})",
                {"max_cpu_loras": capacity},
                {"count": len(names), "capacity": capacity},
            )
        with self._lock:
            unknown = [name for name in names if name not in self._adapters]
            paths = {name: self._adapters[name].path for name in names if name not in unknown}
        if unknown:
            raise ValueError(f"unknown adapters: {', '.join(unknown[:5])}")
        deadline = None if timeout is None else time.monotonic() + timeout
        outcome: dict[str, str | None] = {}
        while len(outcome) < len(paths):
            for name, path in paths.items():
                if name in outcome:
                    continue
                if self.host_cache.get(name) is not None:
                    outcome[name] = None
                elif (error := self.host_cache.error_of(name)) is not None:
                    outcome[name] = str(error)
                else:
                    self.host_cache.lookup(name, path)  # starts its load unless one is running
            if len(outcome) < len(paths):
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"prefetching {len(paths)} adapters took longer than {timeout} s")
                time.sleep(0.005)
        return outcome

    # ---------------------------------------------------------------- residency (worker thread)

    def tier_of(self, name: str | None) -> str | None:
        """Where ``name``'s weights are now, one of ``ADAPTER_TIERS``: "gpu" (a slot), "host" (the
        host tier), "loading" (a disk read in flight) or "disk"; None for the base model."""
        if name is None:
            return None
        if self.slots.slot_of(name) is not None:
            return "gpu"
        if self.host_cache.holds(name):
            return "host"
        return "loading" if self.host_cache.loading(name) else "disk"

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
        host = self.host_cache
        while self._lookahead and host.loads_in_flight < self.load_workers:
            name = self._lookahead[0]
            if name not in self._wanted or self.tier_of(name) != "disk":
                self._lookahead.popleft()  # served, loaded or loading meanwhile
                continue
            victim = host.eviction_candidate()
            if victim is not None and victim in self._wanted:
                return  # the tier is full of adapters that requests wait for: wait for room
            self._lookahead.popleft()
            with self._lock:
                info = self._adapters.get(name)
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
        with self._lock:
            info = self._adapters.get(name)
        if info is None:
            return Admission.LOADING  # not reached: removal is refused while requests for it wait
        if not self.slots.can_acquire(name):
            # No slot now: read the adapter into host RAM meanwhile, a few loads at a time
            # (the same number the loader runs at once) and never in place of an adapter that
            # another request waits for, so the upload can start as soon as a slot frees.
            host = self.host_cache
            if host.loading(name):
                return Admission.LOADING
            if host.holds(name) or host.loads_in_flight >= self.load_workers:
                return Admission.NO_SLOT
            victim = host.eviction_candidate()
            if victim is not None and victim in self._wanted:
                return Admission.NO_SLOT  # it would push out an adapter that a request waits for
            host.lookup(name, info.path)
            return Admission.LOADING
        packed = self.host_cache.lookup(name, info.path)
        if packed is None:
            return Admission.LOADING
        if self.upload_stream is not None and not packed.pinned and self.arena is not None:
            staged = self._staged(packed)  # pageable: copied into a pinned block first
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

    @property
    def uploads_in_flight(self) -> int:
        return len(self._uploads)

    def finish_uploads(self) -> None:
        """Wait for the slot uploads in flight to land (before the slots are parked)."""
        if self.upload_stream is not None:
            self.upload_stream.synchronize()

    def pinned(self) -> list[str]:
        """The adapters pinned, in a slot or on their way into one."""
        return sorted(self.slots.pinned_names())

    def take_failed_loads(self) -> list[str]:
        """The adapters whose load into the host tier failed since the last call."""
        return self.host_cache.take_failures()

    def load_error(self, name: str) -> Exception | None:
        """Why ``name`` could not be read into the host tier, if it could not."""
        return self.host_cache.error_of(name)

    def remove(self, name: str) -> None:
        """Forget ``name``, its slot and host copy; refused while requests for it wait or run."""
        with self._lock:
            if name not in self._adapters:
                raise ValueError(f"unknown adapter {name!r}")
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
        self.host_cache.discard(name)
        self.host_cache.counters.adapters.forget(name)
        self.upload_counters.adapters.forget(name)
        self._pinned_loads.discard(name)
        self._staging.pop(name, None)
        with self._lock:
            del self._adapters[name]
            self._tokenizers.pop(name, None)

    def pin(self, name: str, pinned: bool) -> None:
        """Pin ``name`` and bring it into a slot now (``load_pinned``), or unpin it."""
        with self._lock:
            if name not in self._adapters:
                raise ValueError(f"unknown adapter {name!r}")
            infos = dict(self._adapters)
        if pinned and infos[name].tokens and not self.slots.is_pinned(name):
            holders = sum(1 for n, i in infos.items() if i.tokens and self.slots.is_pinned(n))
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
        self._stager.shutdown(wait=True, cancel_futures=True)
        """Stop the loader threads and children (after the worker has ended)."""
        self.host_cache.close()
        self.template_sandbox.close()
        if self._loader_process is not None:
            self._loader_process.close()


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
