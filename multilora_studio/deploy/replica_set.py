"""Engine replicas of one base behind one dispatcher: one engine per device (or several sharing
a device, each with its part of its memory), threads of this process.

Every replica serves every adapter registered (their weights are read where requests for them
go). A request goes where ``dispatch_rule.affinity_pick`` says: to a replica whose GPU slots hold
its adapter (or that has requests for it in flight), else whose host tier holds it, unless that
replica has more than ``margin`` requests over the least-loaded one. Loads are the dispatcher's
own count of each replica's unfinished requests; which replica holds what comes from each
engine's latest metrics snapshot.

A replica that stops (shut down, or its worker thread died) is taken out: new requests go to
the others. Requests it held end with reason 'abort' (shut down) or 'error' naming the replica
(died); they are not retried elsewhere, because a streamed answer may have sent tokens already.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from multilora_studio.deploy.combined_metrics import combine_metrics
from multilora_studio.deploy.dispatch_rule import DEFAULT_MARGIN, affinity_pick
from multilora_studio.engine import (
    AdapterInfo,
    Engine,
    EngineConfig,
    EngineMetrics,
    RequestStream,
)
from multilora_studio.engine.loop.request_methods import NewRequest
from multilora_studio.engine.serving_engine import ServingEngine
from multilora_studio.engine.text.chat_tokens import Render
from multilora_studio.invalid_setting import InvalidSetting
from multilora_studio.util import ProgressCallback

log = logging.getLogger(__name__)

DEVICE_ENTRY = re.compile(r"^(cpu|cuda:\d+)$")
UNAVAILABLE = np.iinfo(np.int64).max // 2  # the load of a replica taken out: never the least


def parse_devices(text: str) -> list[str]:
    """``--devices``: ``auto`` (every visible GPU, else the CPU) or a comma list of ``cpu`` /
    ``cuda:N``, one replica per entry (a device named twice holds two replicas)."""
    if text.strip() == "auto":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return [f"cuda:{i}" for i in range(count)] or ["cpu"]
    devices = [part.strip() for part in text.split(",") if part.strip()]
    if not devices:
        raise InvalidSetting.of(
            "devices", text, "must name at least one device (auto, cpu, cuda:0,cuda:1, ...)"
        )
    for device in devices:
        if not DEVICE_ENTRY.match(device):
            raise InvalidSetting(
                "{devices} must be cpu or cuda:N entries (or auto), got {entry!r}",
                {"devices": text},
                {"entry": device},
            )
        if device.startswith("cuda:"):
            visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if int(device[5:]) >= visible:
                raise InvalidSetting(
                    "{devices} must exist: {entry} does not ({visible} CUDA GPUs visible)",
                    {"devices": text},
                    {"entry": device, "visible": visible},
                )
    return devices


def replica_configs(config: EngineConfig, devices: Sequence[str]) -> list[EngineConfig]:
    """One config per replica: its device, and where a GPU holds several replicas without a set
    KV size, an equal share of that GPU's memory each."""
    per_device = Counter(devices)
    configs = []
    for device in devices:
        share = 1.0 / per_device[device] if config.kv_cache_memory_gb is None else 1.0
        configs.append(replace(config, device=device, device_memory_share=share))
    return configs


EngineStarter = Callable[[EngineConfig], Engine]


def start_engine(
    config: EngineConfig,
    devices: Sequence[str] | None = None,
    margin: int = DEFAULT_MARGIN,
    progress: ProgressCallback | None = None,
) -> ServingEngine:
    """The engine of one base: a plain ``Engine`` on ``config.device`` when ``devices`` names at
    most one device, else a ``ReplicaSet`` with a replica per entry."""
    if not devices or len(devices) == 1:
        return Engine(replace(config, device=devices[0]) if devices else config, progress=progress)
    return ReplicaSet.start(config, devices, margin, lambda c: Engine(c, progress=progress))


@dataclass
class Placement:
    """A request in flight: its replica, adapter and stream."""

    replica: int
    adapter: str | None
    stream: RequestStream


class ReplicaSet(ServingEngine):
    """Engine replicas of one base model behind the adapter-affinity dispatcher (module docstring).

    Reads (the base, its tokenizer, the adapters registered) come from the first replica: every
    replica has the same ones.
    """

    def __init__(
        self, replicas: Sequence[Engine], margin: int = DEFAULT_MARGIN, watch_interval_s: float = 0.5
    ) -> None:
        if not replicas:
            raise ValueError("a replica set needs at least one engine")
        if margin < 0:
            raise ValueError(f"the dispatch margin must be >= 0 requests, got {margin}")
        first = replicas[0]
        for other in replicas[1:]:
            if (other.model_name, other.base_digest) != (first.model_name, first.base_digest):
                raise ValueError(f"replicas of {first.model_name} and {other.model_name}: one base only")
        self.replicas = list(replicas)
        self.margin = margin
        self.config = first.config
        self.spec, self.base, self.tokenizer = first.spec, first.base, first.tokenizer
        self.model_name, self.base_digest = first.model_name, first.base_digest
        self.device, self.dtype, self.model_folder = first.device, first.dtype, first.model_folder
        self._lock = threading.Lock()  # guards the dispatch state below
        self._loads = [0] * len(replicas)  # unfinished requests per replica
        self._in_flight: list[Counter[str | None]] = [Counter() for _ in replicas]  # per adapter
        self._placed: dict[str, Placement] = {}
        self._taken_out: set[int] = set()
        self.dispatched = [0] * len(replicas)  # requests each replica was given
        self._stopping = threading.Event()
        self._watch = threading.Thread(
            target=self._watch_replicas, args=(watch_interval_s,), name="replica-watch", daemon=True
        )
        self._watch.start()

    @classmethod
    def start(
        cls,
        config: EngineConfig,
        devices: Sequence[str],
        margin: int = DEFAULT_MARGIN,
        starter: EngineStarter = Engine,
    ) -> ReplicaSet:
        """Start a replica per entry of ``devices``: different devices at once, replicas sharing
        a device one after the other (each sizes its KV cache after the previous one's weights
        are in place). Any replica failing stops those started and raises its error."""
        configs = replica_configs(config, devices)
        by_device: dict[str, list[int]] = defaultdict(list)
        for index, device in enumerate(devices):
            by_device[device].append(index)
        engines: list[Engine | None] = [None] * len(devices)

        def start_device(indices: list[int]) -> None:
            for index in indices:
                engines[index] = starter(configs[index])

        with ThreadPoolExecutor(len(by_device), thread_name_prefix="replica-start") as pool:
            futures = [pool.submit(start_device, indices) for indices in by_device.values()]
            errors = [f.exception() for f in futures]
        failed = next((e for e in errors if e is not None), None)
        if failed is not None:
            for engine in engines:
                if engine is not None:
                    engine.shutdown()
            raise failed
        started = [e for e in engines if e is not None]
        log.info("started %d replicas of %s on %s", len(started), started[0].model_name, ", ".join(devices))
        return cls(started, margin)

    # ---------------------------------------------------------------- dispatch

    def _live(self) -> list[int]:
        """Replicas that take requests (the lock held)."""
        return [r for r, engine in enumerate(self.replicas) if r not in self._taken_out and engine.running]

    def _pick(self, adapter: str | None) -> int:
        """The replica for one request (the lock held); RuntimeError when none is left."""
        live = self._live()
        if not live:
            raise RuntimeError(f"every replica of {self.model_name} has stopped")
        loads = np.full(len(self.replicas), UNAVAILABLE, dtype=np.int64)
        loads[live] = [self._loads[r] for r in live]
        if adapter is None:
            return int(np.argmin(loads))
        in_slots: set[int] = set()
        in_host: set[int] = set()
        for r in live:
            snap = self.replicas[r].metrics()
            if self._in_flight[r][adapter] or (
                snap is not None and any(slot.adapter == adapter for slot in snap.slots)
            ):
                in_slots.add(r)
            elif snap is not None and adapter in snap.cpu_adapters:
                in_host.add(r)
        return affinity_pick(loads, (in_slots, in_host), self.margin)

    def _place(self, adapter: str | None) -> int:
        with self._lock:
            replica = self._pick(adapter)
            self._loads[replica] += 1
            self._in_flight[replica][adapter] += 1
            self.dispatched[replica] += 1
        return replica

    def _unplace(self, replica: int, adapter: str | None, request_id: str | None) -> None:
        with self._lock:
            if request_id is not None and self._placed.pop(request_id, None) is None:
                return
            self._loads[replica] -= 1
            self._in_flight[replica][adapter] -= 1

    def _track(self, replica: int, adapter: str | None, stream: RequestStream) -> None:
        request_id = stream.request_id
        with self._lock:
            self._placed[request_id] = Placement(replica, adapter, stream)
        stream.add_done_callback(lambda: self._unplace(replica, adapter, request_id))

    def queue(self, requests: Sequence[NewRequest]) -> list[RequestStream]:
        """Each request dispatched on its own; each replica's share reaches it as one batch. One
        refused (ValueError): those queued already are aborted and the error raised."""
        groups: dict[int, list[int]] = defaultdict(list)
        for index, request in enumerate(requests):
            groups[self._place(request.adapter)].append(index)
        streams: list[RequestStream | None] = [None] * len(requests)
        try:
            for replica, indices in list(groups.items()):
                queued = self.replicas[replica].queue([requests[i] for i in indices])
                for index, stream in zip(indices, queued, strict=True):
                    streams[index] = stream
                    self._track(replica, requests[index].adapter, stream)
                del groups[replica]
        except BaseException:
            for replica, indices in groups.items():  # not queued: their places are given back
                for index in indices:
                    self._unplace(replica, requests[index].adapter, None)
            for queued_stream in streams:
                if queued_stream is not None:
                    self.abort(queued_stream.request_id)
            raise
        return [s for s in streams if s is not None]

    def abort(self, request_id: str) -> None:
        with self._lock:
            placement = self._placed.get(request_id)
        if placement is not None:
            self.replicas[placement.replica].abort(request_id)

    def replica_of(self, request_id: str) -> int | None:
        """The replica an unfinished request runs on."""
        with self._lock:
            placement = self._placed.get(request_id)
        return placement.replica if placement is not None else None

    def loads(self) -> list[int]:
        """Each replica's unfinished requests, as the dispatcher counts them."""
        with self._lock:
            return list(self._loads)

    # ---------------------------------------------------------------- adapters

    def add_adapter(self, name: str, path: str | Path, preload: bool = True) -> AdapterInfo:
        """Register on every replica; ``preload`` reads the weights on one replica only (where
        its first request would go), the others read them if requests for it reach them."""
        with self._lock:
            first = self._pick(None)
        info = self.replicas[first].add_adapter(name, path, preload)
        added = [first]
        try:
            for r, engine in enumerate(self.replicas):
                if r != first:
                    engine.add_adapter(name, path, preload=False)
                    added.append(r)
        except BaseException:
            for r in added:
                self.replicas[r].remove_adapter(name)
            raise
        return info

    def remove_adapter(self, name: str) -> None:
        """Remove from every replica; refused (and kept on all) while a request for it is queued
        or running on any."""
        path = next((info.path for info in self.list_adapters() if info.name == name), None)
        removed: list[int] = []
        try:
            for r, engine in enumerate(self.replicas):
                engine.remove_adapter(name)
                removed.append(r)
        except BaseException:
            for r in removed:
                assert path is not None  # it was removed, so it was there
                self.replicas[r].add_adapter(name, path, preload=False)
            raise

    def prefetch_adapters(self, names: Sequence[str], timeout: float | None = None) -> dict[str, str | None]:
        """Each adapter read into the host tier of the replica its next request would go to."""
        groups: dict[int, list[str]] = defaultdict(list)
        with self._lock:
            for name in names:
                groups[self._pick(name)].append(name)
        results: dict[str, str | None] = {}
        for replica, group in groups.items():
            results.update(self.replicas[replica].prefetch_adapters(group, timeout))
        return results

    def pin_adapter(self, name: str, pinned: bool = True) -> None:
        """Pinned on every replica: a slot is held for it wherever its requests go."""
        for engine in self.replicas:
            engine.pin_adapter(name, pinned)

    def pinned_adapters(self) -> list[str]:
        return self.replicas[0].pinned_adapters()

    def list_adapters(self) -> list[AdapterInfo]:
        return self.replicas[0].list_adapters()

    def has_adapter(self, name: str) -> bool:
        return self.replicas[0].has_adapter(name)

    def encode(
        self, prompt: Any, special_tokens_in_content: bool = False, adapter: str | None = None
    ) -> list[int]:
        return self.replicas[0].encode(prompt, special_tokens_in_content, adapter)

    def tokenizer_for(self, adapter: str | None) -> Any:
        return self.replicas[0].tokenizer_for(adapter)

    def renderer_for(self, adapter: str | None) -> Render:
        return self.replicas[0].renderer_for(adapter)

    def vocab_size_of(self, adapter: str | None) -> int:
        return self.replicas[0].vocab_size_of(adapter)

    # ---------------------------------------------------------------- state

    def metrics(self, fresh: bool = False) -> EngineMetrics | None:
        """The replicas' snapshots as one (``combine_metrics``); ``replica_metrics`` for each."""
        snaps = [snap for _, snap in self.replica_metrics(fresh) if snap is not None]
        return combine_metrics(snaps) if snaps else None

    def replica_metrics(self, fresh: bool = False) -> list[tuple[str, EngineMetrics | None]]:
        """(label, snapshot) per replica: labels are ``0``, ``1``, ... in ``--devices`` order."""
        return [
            (str(r), engine.metrics(fresh) if engine.running else engine.metrics())
            for r, engine in enumerate(self.replicas)
        ]

    def park_bytes(self) -> int:
        return sum(engine.park_bytes() for engine in self.replicas)

    def park(self) -> None:
        """Every replica swapped out (``Engine.park``), together."""
        self._on_every_replica(Engine.park)

    def unpark(self) -> None:
        self._on_every_replica(Engine.unpark)

    def _on_every_replica(self, work: Callable[[Engine], None]) -> None:
        with ThreadPoolExecutor(len(self.replicas), thread_name_prefix="replica-swap") as pool:
            list(pool.map(work, self.replicas))

    @property
    def running(self) -> bool:
        """While at least one replica takes requests."""
        with self._lock:
            return bool(self._live())

    def shutdown(self) -> None:
        self._stopping.set()
        self._on_every_replica(Engine.shutdown)

    def __enter__(self) -> ReplicaSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _watch_replicas(self, interval: float) -> None:
        """Take out a replica whose worker thread ended; fail the requests it still held."""
        while not self._stopping.wait(interval):
            for r, engine in enumerate(self.replicas):
                if r in self._taken_out or engine.worker_alive:
                    continue
                with self._lock:
                    self._taken_out.add(r)
                    orphans = [p.stream for p in self._placed.values() if p.replica == r]
                log.error(
                    "replica %d of %s (%s) stopped; %d requests fail",
                    r,
                    self.model_name,
                    engine.device,
                    len(orphans),
                )
                for stream in orphans:
                    stream.fail(
                        f"replica {r} of {self.model_name} ({engine.device}) stopped during this request"
                    )


def replicas_of(engine: ServingEngine) -> list[tuple[str, ServingEngine]]:
    """(label, engine) of each replica behind ``engine``: itself alone unless it is a set."""
    if isinstance(engine, ReplicaSet):
        return [(str(r), replica) for r, replica in enumerate(engine.replicas)]
    return [("0", engine)]
