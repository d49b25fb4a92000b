"""The bridge between the engine and the window: starts, restarts and stops the engine off the GUI thread.

The engine runs its own worker thread; building it (model conversion, weight
loading) happens on a task thread, and every result reaches the window as a
queued signal. Views read ``host.engine`` only while ``host.state == "ready"``.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from multilora_studio.adapters.base_model import BaseModelRef
from multilora_studio.adapters.registry import Registry
from multilora_studio.demo import offer_demo_adapters
from multilora_studio.deploy import start_engine
from multilora_studio.engine import ServingEngine
from multilora_studio.engine.host_memory import return_freed_memory
from multilora_studio.engine.model_source import check_model_folder
from multilora_studio.gui.library_ops import LoadResult, load_library
from multilora_studio.gui.preferences import EngineChoice
from multilora_studio.gui.tasks import USER_ERRORS, Cancelled, Task, TaskRunner, user_message

log = logging.getLogger(__name__)

STOPPED, LOADING, READY, FAILED = "stopped", "loading", "ready", "failed"


class SettingsRejected(ValueError):
    """The new settings were refused before the running engine was stopped (the message says why)."""


class EngineHost(QObject):
    """Owns the window's engine (see the module docstring): one ``Engine``, or a ``ReplicaSet``
    when the settings name several devices.

    Each engine start first offers the demo adapters to the library (``offer_demo_adapters``:
    once per library, only on the model they were trained on) unless ``demo_adapters`` is off.
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
        self._engine: ServingEngine | None = None
        self._running_engine: ServingEngine | None = (
            None  # kept running while a new start checks its settings
        )
        self._handover = threading.Lock()  # guards _running_engine between the GUI and the start task
        self._boot: Task | None = None
        self.state = STOPPED
        self.error = ""
        self.choice: EngineChoice | None = None
        self.working_choice: EngineChoice | None = None  # the last settings an engine started with
        self.skipped: dict[str, str] = {}

    @property
    def engine(self) -> ServingEngine | None:
        """The running engine, or None while it loads, failed or is stopped."""
        return self._engine if self.state == READY else None

    def start(self, choice: EngineChoice) -> None:
        """(Re)start the engine with ``choice``; a start in progress is cancelled first.

        The new model is resolved and checked while the running engine still runs; when that
        fails the running engine stays (``rejected``). When loading fails after the running
        engine was stopped, the last settings that worked are started again (``failed``).
        """
        if self._boot is not None:
            self._boot.cancel()
        with self._handover:
            self._running_engine, self._engine = self._engine or self._running_engine, None
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
        for engine in (self._engine, self._running_engine):
            if engine is not None:
                engine.shutdown()
        self._engine = self._running_engine = None
        self._set_state(STOPPED)

    # ---------------------------------------------------------------- worker side

    def _build(self, task: Task, choice: EngineChoice) -> tuple[ServingEngine, LoadResult]:
        try:
            model = self._resolve_model(task, choice)
            if model is not None:
                check_model_folder(Path(model))
        except (Cancelled, *USER_ERRORS) as error:
            raise SettingsRejected(user_message(error)) from None
        with self._handover:
            old, self._running_engine = self._running_engine, None
        if old is not None:
            task.report(0.0, "stopping the running engine")
            old.shutdown()
            del old
            return_freed_memory()
        task.report(0.05, f"loading {choice.label}")
        engine = start_engine(
            choice.engine_config(model), choice.device_list(), choice.dispatch_margin, task.report
        )
        try:
            if self.demo_adapters:
                task.report(0.9, "adding the demo adapters")
                offer_demo_adapters(self.registry, BaseModelRef.of_engine(engine))
            task.report(0.9, "registering the library's adapters")
            result = load_library(self.registry, engine, lambda f, m: task.report(0.9 + 0.1 * f, m))
            warm = [r.name for r in self.registry.list_adapters() if r.warm and r.name in result.loaded]
            if warm:
                task.report(1.0, f"reading {len(warm)} warm adapters into host RAM")
                engine.prefetch_adapters(warm[: engine.config.max_cpu_loras or 0])  # what the tier holds
            task.report(1.0, "ready")
        except BaseException:
            engine.shutdown()
            raise
        return engine, result

    def _resolve_model(self, task: Task, choice: EngineChoice) -> str | None:
        if choice.model_source == "embedded":
            return None
        if choice.model_source == "folder":
            return choice.model
        from multilora_studio.adapters.pull import pull

        def not_a_model() -> None:
            raise ValueError(f"{choice.model} is an adapter, not a base model; pull it in the Library")

        result = pull(
            choice.model,
            self.registry,
            not_a_model,  # type: ignore[arg-type]
            progress=lambda f, m: task.notify(0.05 * f, m),
            cancel=task.cancel_event,
        )
        if result.model is None:
            raise ValueError(f"{choice.model} is an adapter, not a base model")
        if task.cancelled:
            raise Cancelled
        return str(result.path)

    # ---------------------------------------------------------------- GUI side

    def _on_ready(self, task: Task, value: tuple[ServingEngine, LoadResult]) -> None:
        engine, result = value
        if task is not self._boot:  # a newer start replaced this one
            engine.shutdown()
            return
        self._boot = None
        self._engine = engine
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
            kept, self._running_engine = self._running_engine, None
        if task.error_type is SettingsRejected and kept is not None and kept.running:
            self._engine = kept
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
