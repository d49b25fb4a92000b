"""Several base models in one process, each an engine of its own (its KV budget, GPU slots and
host tier), sharing the device: colocated while at most ``max_resident`` are loaded, swapped
when more are asked for.

A request leases its base (``lease``): a base that is not loaded is loaded first, after the
least recently used idle base is swapped out to make room (never one with a lease: its requests
run to the end first), and the request waits for that, at most ``load_timeout_s``. While a
request waits for room, new requests for the loaded bases wait too, so those drain and the
bases take turns (time-share) instead of one starving the other. A base
idle for ``keep_alive_s`` is swapped out (Ollama's ``keep_alive``).

A swap-out parks the engine (``Engine.park``): it stays, with its tokenizer, adapters, pins and
host tier, its weights and LoRA slots copied to page-locked host memory and freed on the device
with its KV cache and graphs, before any other base is brought in; the swap-in copies them
back. Host memory is bounded: a base is parked only while its bytes are at most
``park_memory_fraction`` of the host memory available at that moment; otherwise (or for an
engine that cannot park, or with ``park_memory_fraction=0``) its engine is stopped and started
again from its checkpoint on its next request, its adapter registrations and pins applied again
before any request runs on it. A request only ever runs on the engine of the base its model names.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from multilora_studio.deploy.model_aliases import ModelAliases
from multilora_studio.deploy.pool_settings import PoolSettings
from multilora_studio.engine import Engine, EngineConfig, ParkableEngine
from multilora_studio.engine.model.model_source import RANDOM_PREFIX, describe_model
from multilora_studio.engine.residency.host_tier_size import available_host_memory
from multilora_studio.engine.serving_engine import AdapterPinning, ServingEngine, metrics_of, pinned_of

log = logging.getLogger(__name__)

EngineFactory = Callable[[EngineConfig], ServingEngine]


class BaseUnavailable(RuntimeError):
    """A base could not be loaded in time, or failed to load; the message says which and why."""


# a swapped-out base is parked in host memory while its bytes are at most this share of the host
# memory available then (so as much again stays free); 0: swapped-out bases are stopped
DEFAULT_PARK_MEMORY_FRACTION = 0.5
ALIAS_WARM_TIMEOUT_S = 120.0  # an alias's warm adapters still not read after this are left to first use


@dataclass
class PoolBase:
    """One base of the pool: how to start its engine, its adapters, and its engine when loaded
    (``engine``) or parked in host memory (``parked``)."""

    name: str
    config: EngineConfig
    digest: str = ""  # of its weights (checkpoint_digest; "" for random weights)
    adapters: dict[str, Path] = field(default_factory=dict)  # served when its engine was last stopped
    pinned: list[str] = field(default_factory=list)  # pinned when its engine was last stopped
    engine: ServingEngine | None = None
    parked: ServingEngine | None = None  # swapped out, its weights in host memory
    leases: int = 0
    last_used: float = 0.0
    loads: int = 0  # times it was brought onto the device (started, or swapped in from host memory)
    starts: int = 0  # times its engine was started
    loading: bool = False
    unloading: bool = False  # being swapped out (still on the device until that ends)
    error: str | None = None  # why its last load failed


def identify_base(config: EngineConfig) -> tuple[str, str]:
    """(name, weights digest) of a base as its engine will report them, without loading it."""
    if config.model is not None and config.model.startswith(RANDOM_PREFIX):
        return f"random-{config.model[len(RANDOM_PREFIX) :]}", ""
    identity = describe_model(config.model)
    return identity.name, identity.digest


class BasePool:
    """The bases of one server (see the module docstring); every method is thread-safe."""

    def __init__(
        self,
        configs: Sequence[EngineConfig],
        max_resident: int | None = PoolSettings.max_resident_bases,
        keep_alive_s: float | None = PoolSettings.keep_alive,
        load_timeout_s: float = PoolSettings.base_load_timeout,
        engine_factory: EngineFactory = Engine,
        started: Sequence[ServingEngine] = (),
        park_memory_fraction: float = DEFAULT_PARK_MEMORY_FRACTION,
    ) -> None:
        """``started``: engines already running for the first configs (in order), adopted as
        they are (their adapters become the base's registrations). ``max_resident``,
        ``keep_alive_s`` and ``load_timeout_s`` are ``PoolSettings``' bases settings."""
        if not configs:
            raise ValueError("a base pool needs at least one base model")
        PoolSettings(
            max_resident_bases=max_resident, keep_alive=keep_alive_s, base_load_timeout=load_timeout_s
        )
        if not 0 <= park_memory_fraction <= 1:
            raise ValueError(f"park_memory_fraction must be in [0, 1], got {park_memory_fraction}")
        self.park_memory_fraction = park_memory_fraction
        self.max_resident = max_resident or len(configs)
        self.keep_alive_s = keep_alive_s
        self.load_timeout_s = load_timeout_s
        self._factory = engine_factory
        self._lock = threading.Condition()
        self._bases: dict[str, PoolBase] = {}
        self._room_waiters: Counter[str] = Counter()  # base -> requests waiting for it to get room
        self.aliases = ModelAliases()  # other names of its adapters (base_of resolves them)
        for index, config in enumerate(configs):
            engine = started[index] if index < len(started) else None
            name, digest = (
                (engine.model_name, engine.base_digest) if engine is not None else identify_base(config)
            )
            if name in self._bases:
                raise ValueError(f"two base models are both named {name!r}; serve each once")
            base = PoolBase(name, config, digest, engine=engine, last_used=time.monotonic())
            if engine is not None:
                base.loads = base.starts = 1
            self._bases[name] = base
        if sum(b.engine is not None for b in self._bases.values()) > self.max_resident:
            raise ValueError(f"more bases started than max_resident_bases={self.max_resident}")
        self._closed = False
        if keep_alive_s is not None:
            threading.Thread(
                target=self._reap_idle, args=(keep_alive_s,), name="base-pool-keep-alive", daemon=True
            ).start()

    # ------------------------------------------------------------------------------ reading

    @property
    def names(self) -> list[str]:
        return list(self._bases)

    @property
    def primary(self) -> str:
        """The first base: where adapters loaded without naming a base go."""
        return next(iter(self._bases))

    def base(self, name: str) -> PoolBase:
        return self._bases[name]

    def resident(self) -> list[tuple[str, ServingEngine]]:
        """The loaded bases and their engines, in pool order."""
        with self._lock:
            return [(b.name, b.engine) for b in self._bases.values() if b.engine is not None]

    def engines(self) -> list[tuple[str, ServingEngine]]:
        """Every engine the pool holds, in pool order: the loaded bases' and the parked ones'."""
        with self._lock:
            held = [(b.name, b.engine or b.parked) for b in self._bases.values()]
        return [(name, engine) for name, engine in held if engine is not None]

    def base_of(self, model: str) -> tuple[str, str | None] | None:
        """(base, adapter) that ``model`` names: a base (adapter None), one of a base's
        adapters, or an alias of one (``aliases``); None for none of these."""
        if model in self._bases:
            return model, None
        for name in self._bases:
            if self._serves(name, model):
                return name, model
        adapter = self.aliases.target(model)
        if adapter is not None:
            for name in self._bases:
                if self._serves(name, adapter):
                    return name, adapter
        return None

    def _serves(self, base: str, adapter: str) -> bool:
        """Whether ``base`` serves ``adapter`` (``adapters_of``), by one lookup."""
        with self._lock:
            entry = self._bases[base]
            engine = entry.engine or entry.parked
            if engine is None:
                return adapter in entry.adapters
        return engine.has_adapter(adapter)

    def adapters_of(self, base: str) -> dict[str, Path]:
        """The adapters a base serves: its engine's own list while it is loaded or parked
        (adapters added to the engine directly count), else those it had when it was stopped."""
        with self._lock:
            entry = self._bases[base]
            engine = entry.engine or entry.parked
            if engine is None:
                return dict(entry.adapters)
        return {info.name: info.path for info in engine.list_adapters()}

    # ------------------------------------------------------------------------------ leasing

    @contextlib.contextmanager
    def lease(self, name: str, timeout: float | None = None) -> Iterator[ServingEngine]:
        """The engine of base ``name``, loaded (swapping another out) and kept loaded until the
        block ends. BaseUnavailable when it cannot be loaded within ``timeout`` (default
        ``load_timeout_s``)."""
        engine = self.acquire(name, timeout)
        try:
            yield engine
        finally:
            self.release(name)

    def acquire(self, name: str, timeout: float | None = None) -> ServingEngine:
        """``lease`` without the block: pair every call with ``release(name)``."""
        wait_s = self.load_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + wait_s
        base = self._bases[name]
        victim: PoolBase | None = None
        with self._lock:
            waiting = False  # counted in _room_waiters while it waits for another base to drain
            try:
                while True:
                    if self._closed:
                        raise BaseUnavailable("the server is stopping")
                    busy = base.loading or base.unloading
                    if base.engine is not None and not busy and not self._others_wait(base):
                        base.leases += 1
                        base.last_used = time.monotonic()
                        return base.engine
                    if base.engine is None and not busy:
                        room, victim = self._make_room(base)
                        if room:
                            base.loading = True
                            break
                        if not waiting:
                            waiting = True
                            self._room_waiters[name] += 1
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise BaseUnavailable(
                            f"base model {name!r} did not load within {wait_s:g} s"
                            if busy
                            else f"base model {name!r} waits for other bases' requests to finish; "
                            "try again, or allow more resident bases"
                        )
                    self._lock.wait(min(left, 0.5))
            finally:
                if waiting:
                    self._room_waiters[name] -= 1
        if victim is not None:  # off the device before this base comes on it
            self._swap_out(victim, "to make room for " + name)
        return self._load(base)

    def waiting(self, name: str) -> int:
        """Requests for base ``name`` waiting for another base's requests to finish, so that it can load."""
        with self._lock:
            return self._room_waiters[name]

    def _others_wait(self, base: PoolBase) -> bool:
        """Whether requests for other bases wait for room (the lock held): then new leases of a
        loaded base wait too, so that its requests drain and it can be swapped out in turn
        (no base starves another out)."""
        return any(count > 0 for name, count in self._room_waiters.items() if name != base.name)

    def release(self, name: str) -> None:
        with self._lock:
            base = self._bases[name]
            base.leases -= 1
            base.last_used = time.monotonic()
            self._lock.notify_all()

    # ----------------------------------------------------------------------- adapters

    def add_adapter(self, base_name: str, name: str, path: Path, preload: bool = True) -> None:
        """Serve an adapter on a base (loading the base if it is not); ``preload``: read and
        check its weights now (``Engine.add_adapter``)."""
        if self.base_of(name) is not None:
            raise ValueError(f"a model named {name!r} already exists")
        with self.lease(base_name) as engine:
            engine.add_adapter(name, path, preload=preload)

    def register_adapter(self, base_name: str, name: str, path: Path, pinned: bool = False) -> None:
        """Serve an adapter on a base without loading the base: a loaded or parked base's engine
        takes it at once (its weights read on first use), a stopped one when it next starts (an
        adapter it then refuses is logged and dropped, the base still loads); ``pinned``: pinned
        there too (``pin_adapter``; at the start for a stopped base; a pin the engine refuses is
        logged and the adapter served unpinned)."""
        if self.base_of(name) is not None:
            raise ValueError(f"a model named {name!r} already exists")
        with self._lock:
            base = self._bases[base_name]
            # a starting engine takes the registrations it had when the load began; a stopping
            # one hands its own over
            while base.loading or base.unloading:
                self._lock.wait()
            engine = base.engine or base.parked  # a parked engine takes it in host memory
            if engine is None:
                base.adapters[name] = Path(path)
                if pinned:
                    base.pinned.append(name)
                return
            leased = base.engine is not None
            if leased:
                base.leases += 1  # not swapped out while its engine takes the adapter
        try:
            engine.add_adapter(name, path, preload=False)
            if pinned and isinstance(engine, AdapterPinning):
                try:
                    engine.pin_adapter(name)
                except ValueError as error:  # every slot pinned already: served, not pinned
                    log.warning("base model %s: adapter %s not pinned: %s", base_name, name, error)
        finally:
            if leased:
                self.release(base_name)

    def warm_alias(self, alias: str, engine: ServingEngine) -> threading.Thread | None:
        """A request for ``alias`` runs on ``engine``: on the alias's first use there, read its
        warm list (``aliases``) into host RAM, each adapter on its own base while that is loaded,
        on a thread the request does not wait for (returned; None when there is nothing to read)."""
        names = self.aliases.first_use(alias, engine)
        if not names:
            return None
        thread = threading.Thread(target=self._prefetch, args=(alias, names), name="alias-warm", daemon=True)
        thread.start()
        return thread

    def _prefetch(self, alias: str, names: Sequence[str]) -> None:
        by_base: dict[str, list[str]] = {}
        for name in names:
            found = self.base_of(name)
            if found is None or found[1] is None:
                log.info("alias %s: %s is not served; not read", alias, name)
                continue
            by_base.setdefault(found[0], []).append(found[1])
        resident = dict(self.resident())
        for base, adapters in by_base.items():
            engine = resident.get(base)
            if engine is None:
                continue  # not loaded: they are read on first use
            snapshot = metrics_of(engine)
            room = snapshot.cpu_capacity if snapshot is not None and snapshot.cpu_capacity else len(adapters)
            try:
                failures = engine.prefetch_adapters(adapters[:room], timeout=ALIAS_WARM_TIMEOUT_S)
            except (ValueError, TimeoutError, RuntimeError) as error:
                log.warning("alias %s: reading its warm adapters on %s failed: %s", alias, base, error)
                continue
            for name, failure in failures.items():
                if failure is not None:
                    log.warning("alias %s: warm adapter %s not read: %s", alias, name, failure)

    def remove_adapter(self, name: str) -> None:
        found = self.base_of(name)
        if found is None or found[1] is None:
            raise ValueError(f"no adapter named {name!r}")
        base_name = found[0]
        with self.lease(base_name) as engine:
            engine.remove_adapter(name)

    # ------------------------------------------------------------------------ lifecycle

    def shutdown(self) -> None:
        """Stop every engine (requests still running are aborted by the engines themselves); one
        being swapped in or out is stopped when that ends."""
        with self._lock:
            self._closed = True
            engines = []
            for base in self._bases.values():
                if not base.unloading and not base.loading:
                    engines += [e for e in (base.engine, base.parked) if e is not None]
                    base.engine = base.parked = None
            self._lock.notify_all()
        for engine in engines:
            engine.shutdown()

    def __enter__(self) -> BasePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ------------------------------------------------------------------------- internals

    def _make_room(self, base: PoolBase) -> tuple[bool, PoolBase | None]:
        """Whether ``base`` may load now (the lock held), and the base to swap out first: none
        while a place is free, else the least recently used idle loaded base, marked
        ``unloading`` here (the caller swaps it out, then loads ``base``)."""
        on_device = [b for b in self._bases.values() if b.engine is not None or b.loading]
        if len(on_device) < self.max_resident:
            return True, None
        idle = [b for b in on_device if b.leases == 0 and not b.loading and not b.unloading and b is not base]
        if not idle:
            return False, None
        victim = min(idle, key=lambda b: b.last_used)
        victim.unloading = True
        return True, victim

    def _swap_out(self, base: PoolBase, why: str) -> None:
        """Park ``base``'s engine in host memory, or stop it (module docstring). Called without
        the lock on a base marked ``unloading`` (no lease: no request runs on it); its device
        memory is free when this returns."""
        engine = base.engine
        assert engine is not None  # only a loaded base is marked unloading
        adapters: dict[str, Path] = {}
        pinned: list[str] = []
        parked = self._park(base.name, engine, why)
        if not parked:
            try:
                adapters = {info.name: info.path for info in engine.list_adapters()}
                pinned = pinned_of(engine)
            except RuntimeError as error:  # its worker ended: what it served is lost
                log.warning("base model %s: its adapters could not be read: %s", base.name, error)
            log.info("stopping base model %s %s", base.name, why)
            engine.shutdown()
        with self._lock:
            base.engine = None
            base.parked = engine if parked else None
            if not parked:
                base.adapters, base.pinned = adapters, pinned
            base.unloading = False
            closed = self._closed
            if closed:
                base.parked = None
            self._lock.notify_all()
        if closed and parked:  # the pool was shut down meanwhile
            engine.shutdown()

    def _park(self, name: str, engine: ServingEngine, why: str) -> bool:
        """Park ``engine`` (``Engine.park``) if it can be and its bytes fit the host memory
        bound; False when it was not parked."""
        if self.park_memory_fraction <= 0 or not isinstance(engine, ParkableEngine):
            return False
        try:
            nbytes = engine.park_bytes()
            available = available_host_memory()
            if nbytes > self.park_memory_fraction * available:
                log.info(
                    "base model %s: its %.2f GB are more than %g of the %.2f GB of host memory "
                    "available; it is stopped, not parked", name, nbytes / 1e9,
                    self.park_memory_fraction, available / 1e9,
                )  # fmt: skip
                return False
            started = time.perf_counter()
            engine.park()
        except (RuntimeError, ValueError, OSError) as error:
            log.warning("base model %s could not be parked (%s); it is stopped", name, error)
            return False
        log.info(
            "parked base model %s in host memory %s (%.2f GB, %.2f s)",
            name, why, nbytes / 1e9, time.perf_counter() - started,
        )  # fmt: skip
        return True

    def _load(self, base: PoolBase) -> ServingEngine:
        """Bring ``base`` onto the device (``base.loading`` set by the caller): swap its parked
        engine in, else start one."""
        started = time.perf_counter()
        engine = self._unpark(base)
        fresh = engine is None
        if engine is None:
            engine = self._start(base)
        with self._lock:
            closed = self._closed
            base.parked = None
            if not closed:  # a pool shut down while this base loaded never holds its engine
                base.engine, base.error = engine, None
                base.loads += 1
                base.starts += int(fresh)
                base.leases += 1
                base.last_used = time.monotonic()
            base.loading = False
            self._lock.notify_all()
        if closed:
            engine.shutdown()
            raise BaseUnavailable("the server is stopping")
        how = "started" if fresh else "swapped in from host memory"
        log.info("base model %s %s in %.2f s", base.name, how, time.perf_counter() - started)
        return engine

    def _unpark(self, base: PoolBase) -> ServingEngine | None:
        """``base``'s parked engine swapped back in (it stays ``parked`` meanwhile, so that its
        adapters are found; ``_load`` moves it to ``engine``); None when it had none, or when
        the swap-in failed (that engine is then stopped, its registrations kept for a start)."""
        engine = base.parked  # only this thread changes it while the base is loading
        if engine is None:
            return None
        assert isinstance(engine, ParkableEngine)  # only those are parked
        try:
            engine.unpark()
            return engine
        except (RuntimeError, ValueError, OSError) as error:  # torch's out-of-memory is a RuntimeError
            log.warning("base model %s could not be swapped in (%s); starting it again", base.name, error)
        adapters: dict[str, Path] = {}
        pinned: list[str] = []
        try:
            adapters = {info.name: info.path for info in engine.list_adapters()}
            pinned = pinned_of(engine)
        except RuntimeError as error:
            log.warning("base model %s: its adapters could not be read: %s", base.name, error)
        with self._lock:
            base.adapters, base.pinned, base.parked = adapters, pinned, None
        engine.shutdown()
        return None

    def _start(self, base: PoolBase) -> ServingEngine:
        """A new engine for ``base`` with its registrations and pins (BaseUnavailable if it fails)."""
        try:
            engine = self._factory(base.config)
        except Exception as error:
            with self._lock:
                base.loading = False
                base.error = str(error)
                self._lock.notify_all()
            raise BaseUnavailable(f"base model {base.name!r} failed to load: {error}") from error
        for name, path in list(base.adapters.items()):
            try:
                engine.add_adapter(name, path, preload=False)
            except (ValueError, OSError) as error:
                log.warning("base model %s: adapter %s not served: %s", base.name, name, error)
        if isinstance(engine, AdapterPinning):
            self._pin_again(base, engine)
        return engine

    @staticmethod
    def _pin_again(base: PoolBase, engine: AdapterPinning) -> None:
        """Pin what ``base`` pinned when its engine was last stopped."""
        for name in base.pinned:
            try:
                engine.pin_adapter(name)
            except ValueError as error:  # not served any more, or more pins than slots
                log.warning("base model %s: adapter %s not pinned again: %s", base.name, name, error)

    def _reap_idle(self, keep: float) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                now = time.monotonic()
                idle = [
                    b
                    for b in self._bases.values()
                    if b.engine is not None
                    and b.leases == 0
                    and not b.loading
                    and not b.unloading
                    and now - b.last_used >= keep
                ]
                for base in idle:
                    base.unloading = True
                if not idle:
                    self._lock.wait(min(keep / 4, 1.0))
            for base in idle:
                self._swap_out(base, f"after {keep:g} s idle")
