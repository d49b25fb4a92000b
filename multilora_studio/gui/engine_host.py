"""The bridge between the engines and the window: starts, restarts and stops them off the GUI thread.

The window serves one or several base models, each an engine of its own in a ``BasePool``
(Settings' models list; loaded and swapped as ``serve --model A --model B`` does). Each engine
runs its own worker thread; building them (model conversion, weight loading) happens on a task
thread, and every result reaches the window as a queued signal. Views read ``host.pool`` and
``host.engine`` (the first base's engine while it is loaded) only while ``host.state ==
"ready"``; work on a base's engine off the GUI thread holds a lease (``host.lease``,
``host.lease_for``), so that the base is not swapped out under it; a lease given a progress
callback hears the base's load when it must be loaded first (a swap).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from multilora_studio.adapters.base_model import BaseModelRef
from multilora_studio.adapters.registry import Registry
from multilora_studio.default_model import DEFAULT_MODEL_REPO, ensure_default_model
from multilora_studio.demo import offer_demo_adapters
from multilora_studio.deploy import BasePool, BaseUnavailable, start_engine
from multilora_studio.deploy.base_settings import check_kv_sizes
from multilora_studio.engine import EngineConfig, ServingEngine
from multilora_studio.engine.model.model_source import RANDOM_PREFIX, check_model_folder
from multilora_studio.engine.residency.host_memory import return_freed_memory
from multilora_studio.engine.serving_engine import metrics_of
from multilora_studio.engine.step.device_setup import resolve_device
from multilora_studio.gui.library_ops import LoadResult, base_for, load_library
from multilora_studio.gui.preferences import BaseEntry, EngineChoice
from multilora_studio.gui.tasks import USER_ERRORS, Cancelled, Task, TaskRunner, user_message

log = logging.getLogger(__name__)

STOPPED, LOADING, READY, FAILED = "stopped", "loading", "ready", "failed"
Report = Callable[[float, str], None]


class SettingsRejected(ValueError):
    """The new settings were refused before the running engine was stopped (the message says why)."""


class EngineHost(QObject):
    """Owns the window's base pool (see the module docstring); each base's engine is one
    ``Engine``, or a ``ReplicaSet`` when the settings name several devices.

    Each start first offers the demo adapters to the library (``offer_demo_adapters``: once per
    library, only on the model they were trained on) unless ``demo_adapters`` is off.
    ``load_progress`` holds each base's last load progress (fraction, message) while it loads
    after the start (a swap), written by the loading thread, read by the Monitor.
    """

    stateChanged = Signal(str)
    progress = Signal(float, str)
    ready = Signal()
    failed = Signal(str)  # loading failed; the last settings that worked are started again if any
    rejected = Signal(str)  # the new settings were refused before the running engine was stopped
    adaptersChanged = Signal()

    def __init__(self, registry: Registry, parent: QObject | None = None, demo_adapters: bool = True) -> None:
        super().__init__(parent)
        self.registry = registry
        self.demo_adapters = demo_adapters
        self.tasks = TaskRunner(self)
        self._pool: BasePool | None = None
        self._running_pool: BasePool | None = None  # kept running while a new start checks its settings
        self._handover = threading.Lock()  # guards _running_pool between the GUI and the start task
        self._boot: Task | None = None
        self.state = STOPPED
        self.error = ""
        self.choice: EngineChoice | None = None
        self.working_choice: EngineChoice | None = None  # the last settings an engine started with
        self.skipped: dict[str, str] = {}
        self.load_progress: dict[str, tuple[float, str]] = {}
        self._load_watchers: dict[str, list[Report]] = {}  # base -> leases waiting for its load
        self._watch_lock = threading.Lock()

    @property
    def pool(self) -> BasePool | None:
        """The running bases, or None while they load, failed or are stopped."""
        return self._pool if self.state == READY else None

    @property
    def engine(self) -> ServingEngine | None:
        """The first base's engine while it is loaded (None while it is swapped out, or while
        the pool loads, failed or is stopped)."""
        pool = self.pool
        if pool is None:
            return None
        return dict(pool.resident()).get(pool.primary)

    @contextlib.contextmanager
    def lease(self, base: str | None = None, report: Report | None = None) -> Iterator[ServingEngine]:
        """The engine of ``base`` (default the first), loaded if it is swapped out and kept
        loaded until the block ends (off the GUI thread: a load takes seconds). ``report``
        hears the wait and the load's progress when the base is not loaded. BaseUnavailable when
        it cannot load, or when a restart stops the pool while this waits."""
        pool = self._pool
        if pool is None:
            raise RuntimeError("the engine is not running")
        name = base or pool.primary
        with self._watching(name, report if name not in dict(pool.resident()) else None):
            try:
                engine = pool.acquire(name)
            except BaseUnavailable:
                if pool is not self._pool:  # a restart (or the window closing) stopped the pool
                    raise BaseUnavailable(
                        f"the engines restarted while this waited for base model {name}; try again"
                    ) from None
                raise
        try:
            yield engine
        finally:
            pool.release(name)

    @contextlib.contextmanager
    def _watching(self, base: str, report: Report | None) -> Iterator[None]:
        """``report`` hears base ``base``'s load progress until the block ends."""
        if report is None:
            yield
            return
        report(0.0, f"waiting for base model {base} to load (it is swapped out)")
        with self._watch_lock:
            self._load_watchers.setdefault(base, []).append(report)
        try:
            yield
        finally:
            with self._watch_lock:
                self._load_watchers[base].remove(report)

    def _tell_watchers(self, base: str, fraction: float, message: str) -> None:
        with self._watch_lock:
            watchers = list(self._load_watchers.get(base, ()))
        for report in watchers:
            report(fraction, f"loading base model {base}: {message}")

    def base_folder(self, base: str, progress: Report | None = None) -> Path:
        """The folder of base ``base``'s weights, without loading its engine (the embedded model
        is converted first if it never was)."""
        pool = self._pool
        if pool is None:
            raise RuntimeError("the engine is not running")
        model = pool.base(base).config.model
        if model is None:
            return ensure_default_model(progress).path
        if model.startswith(RANDOM_PREFIX):
            raise ValueError(f"base model {base} has random weights and no folder")
        return Path(model).expanduser()

    def hub_repo_of(self, base: str) -> str:
        """The Hub repository of base ``base`` (to search for its adapters): the embedded
        model's, an ``org/name`` from the Hub cache; "" for a local folder."""
        pool = self._pool
        if pool is None:
            return ""
        if pool.base(base).config.model is None:
            return DEFAULT_MODEL_REPO
        return base if "/" in base else ""

    def base_for_adapter(self, name: str) -> str:
        """The base that serves library adapter ``name``, or would serve it (``base_for``),
        else the first base."""
        pool = self._pool
        if pool is None:
            raise RuntimeError("the engine is not running")
        found = pool.base_of(name)
        if found is not None:
            return found[0]
        record = self.registry.find(name)
        digests = {base: pool.base(base).digest for base in pool.names}
        return (base_for(record, digests) if record is not None else None) or pool.primary

    def lease_for(self, adapter: str) -> contextlib.AbstractContextManager[ServingEngine]:
        """``lease`` of the base that serves (or would serve) library adapter ``adapter``."""
        return self.lease(self.base_for_adapter(adapter))

    def start(self, choice: EngineChoice) -> None:
        """(Re)start the engine with ``choice``; a start in progress is cancelled first.

        The new model is resolved and checked while the running engine still runs; when that
        fails the running engine stays (``rejected``). When loading fails after the running
        engine was stopped, the last settings that worked are started again (``failed``).
        """
        if self._boot is not None:
            self._boot.cancel()
        with self._handover:
            self._running_pool, self._pool = self._pool or self._running_pool, None
        self.choice = choice
        self._set_state(LOADING)
        task = self.tasks.run(
            "engine-start",
            lambda t: self._build(t, choice),
            lambda value: self._on_ready(task, value),
            lambda message: self._on_failed(task, message),
            self.progress.emit,
        )
        self._boot = task

    def cancel_start(self) -> None:
        """Stop a start in progress where it can be stopped (conversion, Hub download, adapters)."""
        if self._boot is not None:
            self._boot.cancel()

    def reload_adapters(self) -> None:
        """Tell the views that the served adapters changed."""
        self.adaptersChanged.emit()

    def shutdown(self) -> None:
        """Stop the engine now (on window close); requests in flight end with 'abort'."""
        if self._boot is not None:
            self._boot.cancel()
            self._boot.wait(30)
        for pool in (self._pool, self._running_pool):
            if pool is not None:
                pool.shutdown()
        self._pool = self._running_pool = None
        self._set_state(STOPPED)

    # ---------------------------------------------------------------- worker side

    def _build(self, task: Task, choice: EngineChoice) -> tuple[BasePool, LoadResult]:
        try:
            bases = choice.bases()
            configs = choice.engine_configs(
                [
                    self._resolve_model(
                        task, base, f"base {index + 1} of {len(bases)}: " if len(bases) > 1 else ""
                    )
                    for index, base in enumerate(bases)
                ]
            )
            for config in configs:
                if config.model is not None:
                    check_model_folder(Path(config.model))
            check_kv_sizes(configs, self._on_gpu(choice))
        except (Cancelled, *USER_ERRORS) as error:
            raise SettingsRejected(user_message(error)) from None
        with self._handover:
            old, self._running_pool = self._running_pool, None
        if old is not None:
            task.report(0.0, "stopping the running engine")
            old.shutdown()
            del old
            return_freed_memory()
        self.load_progress = {}
        pool = self._start_pool(task, choice, configs)
        try:
            primary = dict(pool.resident())[pool.primary]
            if self.demo_adapters:
                task.report(0.9, "adding the demo adapters")
                offer_demo_adapters(self.registry, BaseModelRef.of_engine(primary))
            task.report(0.9, "registering the library's adapters")
            result = load_library(self.registry, pool, lambda f, m: task.report(0.9 + 0.1 * f, m))
            warm = [r.name for r in self.registry.list_adapters() if r.warm and r.name in result.loaded]
            for base, engine in pool.resident():
                own = [name for name in warm if pool.base_of(name) == (base, name)]
                if own:
                    task.report(1.0, f"reading {len(own)} warm adapters of {base} into host RAM")
                    snapshot = metrics_of(engine, fresh=True)
                    room = snapshot.cpu_capacity if snapshot is not None else len(own)  # the tier's size
                    engine.prefetch_adapters(own[:room])
            task.report(1.0, "ready")
        except BaseException:
            pool.shutdown()
            raise
        return pool, result

    def _start_pool(self, task: Task, choice: EngineChoice, configs: list[EngineConfig]) -> BasePool:
        """The bases of ``configs``, the first ``max_resident_bases`` of them started now; a later
        load (a swap) reports its progress into ``load_progress``."""
        max_resident, keep_alive = choice.pool_options
        resident = max_resident or len(configs)
        devices = choice.device_list()
        names: dict[int, str] = {}  # id of a base's config -> its name

        def load(config: EngineConfig) -> ServingEngine:
            name = names.get(id(config), "")

            def report(fraction: float, message: str) -> None:
                self.load_progress[name] = (fraction, message)
                self._tell_watchers(name, fraction, message)

            report(0.0, "loading")
            try:
                return start_engine(config, devices, choice.dispatch_margin, report)
            finally:
                self.load_progress.pop(name, None)

        started: list[ServingEngine] = []
        try:
            for index, config in enumerate(configs[:resident]):
                label = "" if len(configs) == 1 else f" (base {index + 1} of {len(configs)})"
                task.report(0.05, f"loading {config.model or choice.label}{label}")
                started.append(start_engine(config, devices, choice.dispatch_margin, task.report))
            pool = BasePool(configs, max_resident, keep_alive, engine_factory=load, started=started)
        except BaseException:
            for engine in started:
                engine.shutdown()
            raise
        names.update({id(pool.base(name).config): name for name in pool.names})
        return pool

    @staticmethod
    def _on_gpu(choice: EngineChoice) -> bool:
        devices = choice.device_list()
        return resolve_device(devices[0] if devices else choice.device).type == "cuda"

    def _resolve_model(self, task: Task, base: BaseEntry, which: str) -> str | None:
        """The folder of ``base`` (None: the embedded model): a Hub repository is pulled into
        the HF cache first (``HF_HUB_OFFLINE``: from the cache), its progress reported after
        ``which``."""
        if base.source == "embedded":
            return None
        if base.source == "folder":
            return base.model
        from multilora_studio.adapters.pull import pull

        def not_a_model() -> None:
            raise ValueError(f"{base.model} is an adapter, not a base model; pull it in the Library")

        result = pull(
            base.model,
            self.registry,
            not_a_model,  # type: ignore[arg-type]
            progress=lambda f, m: task.notify(0.05 * f, which + m),
            cancel=task.cancel_event,
        )
        if result.model is None:
            raise ValueError(f"{base.model} is an adapter, not a base model")
        if task.cancelled:
            raise Cancelled
        return str(result.path)

    # ---------------------------------------------------------------- GUI side

    def _on_ready(self, task: Task, value: tuple[BasePool, LoadResult]) -> None:
        pool, result = value
        if task is not self._boot:  # a newer start replaced this one
            pool.shutdown()
            return
        self._boot = None
        self._pool = pool
        self.working_choice = self.choice
        self.skipped = dict(result.skipped)
        self.error = ""
        self._set_state(READY)
        self.ready.emit()
        self.adaptersChanged.emit()

    def _on_failed(self, task: Task, message: str) -> None:
        if task is not self._boot:
            return
        self._boot = None
        with self._handover:
            kept, self._running_pool = self._running_pool, None
        if task.error_type is SettingsRejected and kept is not None:
            self._pool = kept
            self.choice = self.working_choice
            self.error = message
            self._set_state(READY)
            self.rejected.emit(self.error)
            return
        if task.cancelled:
            self.error = "loading was cancelled; apply the settings again to start the engine"
            self._set_state(STOPPED)
            return
        self.error = message
        self._set_state(FAILED)
        previous = self.working_choice
        if previous is not None and previous != self.choice:
            self.working_choice = None  # tried once: a failure of the previous settings stops here
            self.start(previous)
        self.failed.emit(message)

    def _set_state(self, state: str) -> None:
        self.state = state
        self.stateChanged.emit(state)
