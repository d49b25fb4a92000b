"""The batched multi-LoRA engine: one base model, many adapters, one step loop on one thread.

``Engine`` is the client side: any thread may submit, abort, add or remove adapters. Its
calls either act on thread-safe state (the adapters added, the host tier) or post a
command (``loop/commands.py``) to the worker thread (``loop/worker.py``), the only thread that
touches the device.
"""

from __future__ import annotations

import gc
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from multilora_studio.engine.batch.activation import NEVER, adapter_start
from multilora_studio.engine.batch.sequence import Sequence as Seq
from multilora_studio.engine.config import EngineConfig
from multilora_studio.engine.errors import EngineStopped, InvalidRequest
from multilora_studio.engine.loop.commands import (
    AbortRequest,
    AddRequests,
    CallOnWorker,
    Command,
    CommandQueue,
    Park,
    PinAdapter,
    RemoveAdapter,
    Shutdown,
    SnapshotMetrics,
    Unpark,
)
from multilora_studio.engine.loop.request_methods import NewRequest
from multilora_studio.engine.loop.requests import RequestStream
from multilora_studio.engine.loop.worker import EngineWorker
from multilora_studio.engine.outputs import EngineMetrics, RequestOutput
from multilora_studio.engine.residency.adapter_catalog import AdapterInfo, ThreadSafeAdapterCatalog
from multilora_studio.engine.residency.tier_manager import WorkerTierManager
from multilora_studio.engine.sampling_params import SamplingParams
from multilora_studio.engine.serving_engine import ServingEngine
from multilora_studio.engine.step.device_setup import load_on_device, resolve_device, resolve_dtype
from multilora_studio.engine.text.chat_tokens import Render
from multilora_studio.engine.text.prompts import encode_prompt
from multilora_studio.util import ProgressCallback

T = TypeVar("T")
log = logging.getLogger(__name__)


class Engine(ServingEngine):
    """Serve a base model and its LoRA adapters; see the module docstring."""

    def __init__(self, config: EngineConfig | None = None, progress: ProgressCallback | None = None) -> None:
        self.config = config or EngineConfig()
        self.device = resolve_device(self.config.device)
        self.dtype = resolve_dtype(self.config.dtype, self.device)
        self._commands = CommandQueue()
        self._stopping = False
        self._request_counter = itertools.count()
        ready: Future[EngineWorker] = Future()
        self._thread = threading.Thread(
            target=self._worker_main, args=(progress, ready), name="engine-worker", daemon=True
        )
        self._thread.start()
        self.worker = ready.result()  # the step loop; other threads only read its counters
        base = self.worker.base
        self.base = base
        self.spec = base.spec
        self.tokenizer = base.tokenizer
        self.model_name = base.name
        self.base_digest = base.digest
        self.model_folder = base.folder
        self.runner = self.worker.runner  # the device side: touched by the worker thread only
        self.catalog: ThreadSafeAdapterCatalog = self.worker.catalog  # the adapters, for any thread
        self.adapter_loader = self.catalog.host_tier.loader
        self.step_trace = self.worker.step_trace  # the recent steps, for benchmarks and diagnosis
        self.cpu_threads = self.worker.cpu_threads

    def _worker_main(self, progress: ProgressCallback | None, ready: Future[EngineWorker]) -> None:
        catalog = tiers = None
        try:
            base, runner, blocks = load_on_device(self.config, self.device, self.dtype, progress)
            started = time.perf_counter()
            wake = self._commands.wake.set
            catalog = ThreadSafeAdapterCatalog(
                self.config, base.spec, base.name, self.device, self.dtype, wake, base.tokenizer
            )
            tiers = WorkerTierManager(self.config, catalog, runner.lora, self.device, self.dtype, wake)
            phases = runner.startup_seconds
            phases["adapter tiers"] = time.perf_counter() - started
            started = time.perf_counter()
            worker = EngineWorker(self.config, base, runner, blocks, catalog, tiers, self._commands)
            phases["step loop"] = time.perf_counter() - started
            log.info("engine ready: %s", ", ".join(f"{name} {s:.2f} s" for name, s in phases.items()))
        except BaseException as error:
            if tiers is not None:
                tiers.close()
            if catalog is not None:
                catalog.close()
            ready.set_exception(error)
            return
        # The start-up heap (torch, transformers, the model's objects: ~250k) leaves the
        # collector's generations until shutdown: a full collection walking it paused a step by
        # 115-130 ms here, and scored prompts (an entry per token) set one off about every 60k.
        gc.collect()
        gc.freeze()
        ready.set_result(worker)
        worker.run()

    # ---------------------------------------------------------------- adapters

    def add_adapter(self, name: str, path: str | Path, preload: bool = True) -> AdapterInfo:
        """Validate the PEFT folder at ``path`` and make it servable as ``name``.

        ``preload=False`` checks the config and the safetensors header only and reads the
        weights on first use (for libraries of many adapters); a problem only the weights can
        show (NaN/Inf) then fails that adapter's requests with the validation message.
        """
        return self.catalog.add(name, path, preload)

    def remove_adapter(self, name: str) -> None:
        """Forget ``name``; refused while requests for it are queued or running."""
        self._call(RemoveAdapter(name))

    def prefetch_adapters(self, names: Sequence[str], timeout: float | None = None) -> dict[str, str | None]:
        """Read ``names`` into the host tier ahead of their first request and wait for them.

        Loads run as requests' loads do (``adapter_load_workers`` at once). Returns each
        name's load error, or None once it is in host RAM. Raises ValueError for a name never
        added or more names than ``max_cpu_loras``, and TimeoutError when ``timeout``
        seconds pass first. Host-tier hits are not counted for the prefetch itself.
        """
        return self.catalog.prefetch(names, timeout)

    def pin_adapter(self, name: str, pinned: bool = True) -> None:
        """Keep ``name`` in a GPU slot, loading it into one now (or let it be evicted again).

        The load runs in the background like a request's: ``list_adapters`` / the metrics show
        the adapter in its slot once it is there.
        """
        self._call(PinAdapter(name, pinned))

    def pinned_adapters(self) -> list[str]:
        """The adapters pinned (``pin_adapter``), whether in their slot yet or not."""
        return self._call(CallOnWorker(self.worker.tiers.pinned))

    def list_adapters(self) -> list[AdapterInfo]:
        return self.catalog.infos()

    def has_adapter(self, name: str) -> bool:
        """Whether ``name`` was added (and not removed); one lookup, however many there are."""
        return self.catalog.has(name)

    # ---------------------------------------------------------------- requests

    def encode(
        self, prompt: Any, special_tokens_in_content: bool = False, adapter: str | None = None
    ) -> list[int]:
        """Token ids of a text prompt, chat messages (through the chat template) or ids as given,
        with ``adapter``'s own tokenizer and template where its folder has them.

        A chat message's text that spells a special token (``<|im_start|>``) is tokenized as
        text unless ``special_tokens_in_content`` (trusted input only).
        """
        where = str(self.base.folder) if self.base.folder is not None else self.model_name
        vocab = self.catalog.vocab_size_of(adapter)
        tokenizer = self.tokenizer_for(adapter)
        render = self.renderer_for(adapter)
        return encode_prompt(prompt, tokenizer, vocab, special_tokens_in_content, where, render)

    def vocab_size_of(self, adapter: str | None) -> int:
        """The vocabulary of ``adapter``'s requests: the base's, larger where it adds tokens."""
        return self.catalog.vocab_size_of(adapter)

    def tokenizer_for(self, adapter: str | None) -> Any:
        """The tokenizer (and chat template) of ``adapter``'s requests: its own, else the base's."""
        own = self.catalog.tokenizer_of(adapter)
        return own.tokenizer if own is not None else self.tokenizer

    def renderer_for(self, adapter: str | None) -> Render:
        """How ``adapter``'s chat template renders (``tokenizer_for``'s): an adapter's own in a
        sandbox with a deadline and an output cap (``template_sandbox``), the base's here."""
        return self.catalog.renderer_of(adapter)

    def queue(self, requests: Sequence[NewRequest]) -> list[RequestStream]:
        """Validate every request, then queue them together: they reach the scheduler as one batch.
        One refused (ValueError), none is queued."""
        prepared = [self._prepare(request) for request in requests]
        self._post(AddRequests(prepared))
        return [stream for _, stream in prepared]

    def _prepare(self, request: NewRequest) -> tuple[Seq, RequestStream]:
        prompt, adapter, request_id = request.prompt, request.adapter, request.request_id
        params = request.params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError("params must be a SamplingParams")
        if adapter is not None:
            self.catalog.check_known(adapter)
        token_ids = self.encode(prompt, adapter=adapter)
        if not token_ids:
            raise InvalidRequest("the prompt is empty", "prompt")
        if len(token_ids) >= self.config.max_model_len:
            raise InvalidRequest(
                f"the prompt has {len(token_ids)} tokens; max_model_len is {self.config.max_model_len}",
                "prompt",
            )
        vocab = self.catalog.vocab_size_of(adapter)
        for name, ids in (
            ("stop_token_ids", params.stop_token_ids),
            ("logit_bias", params.logit_bias),
            ("bad_words_token_ids", [t for word in params.bad_words_token_ids for t in word]),
        ):
            bad = [t for t in ids if t >= vocab]
            if bad:
                raise InvalidRequest(
                    f"{name} has token ids outside the vocabulary [0, {vocab}): {bad[:5]}", name
                )
        if adapter is not None:
            if params.adapter_scale != 1.0 and self.catalog.kind_of(adapter) == "DoRA":
                raise InvalidRequest(
                    f"adapter_scale={params.adapter_scale:g}: {adapter!r} is a DoRA adapter, whose "
                    "per-row magnitude normalisation is fixed for strength 1 (leave adapter_scale at 1)",
                    "adapter_scale",
                )
        elif params.adapter_scale != 1.0:
            raise InvalidRequest(
                f"adapter_scale={params.adapter_scale:g} needs an adapter: a base-model request "
                "has no LoRA term to scale (pick an adapter, or leave adapter_scale at 1)",
                "adapter_scale",
            )
        if params.structured is not None:
            own = self.catalog.tokenizer_of(adapter)
            if own is not None and not own.extends_base:
                raise InvalidRequest(
                    f"structured output for {adapter!r} is not supported: its own tokenizer gives "
                    "the base's token ids other meanings (grammars follow the base's tokenizer)",
                    "structured",
                )
            self.worker.grammars.compile(params.structured)  # ValueError now, not in the step loop
        request_id = request_id or f"req-{next(self._request_counter)}-{uuid.uuid4().hex[:8]}"
        output = RequestOutput(request_id, adapter, token_ids, arrival_time=time.monotonic())
        stream = RequestStream(output, request.loop)
        own = self.catalog.tokenizer_of(adapter)
        eos = tuple(sorted({*self.spec.eos_token_ids, *(own.eos_token_ids if own is not None else ())}))
        seq = Seq(request_id, token_ids, adapter, params, arrival_step=0, eos_token_ids=eos)
        seq.adapter_start = adapter_start(token_ids, self.catalog.invocation_of(adapter))
        if seq.adapter_start == NEVER:
            log.warning(
                "request %s: the prompt lacks the invocation tokens of aLoRA adapter %r; it runs "
                "as the base model (as PEFT runs it)", request_id, adapter,
            )  # fmt: skip
        return seq, stream

    def abort(self, request_id: str) -> None:
        """Stop a request; it finishes with reason 'abort' and its KV blocks are freed."""
        self._post(AbortRequest(request_id))

    # ---------------------------------------------------------------- swaps (BasePool)

    def park_bytes(self) -> int:
        """Bytes a ``park`` holds in host memory: the base weights and the LoRA slots."""
        return self._call(CallOnWorker(self.runner.park_bytes))

    def park(self) -> None:
        """Swap the base out, keeping this engine: its weights and LoRA slots are copied to
        page-locked host memory and freed on the device with its KV cache and CUDA graphs
        (``engine/residency/device_parking.py``; on the CPU the weights stay where they are). Adapters,
        pins, the host tier and the tokenizer stay. RuntimeError while requests are queued or
        running; requests submitted while parked wait for ``unpark``."""
        self._call(Park())

    def unpark(self) -> None:
        """Swap the base back in: the weights and slots copied back, the KV cache allocated
        again; CUDA graphs are captured again by the first steps that need them."""
        self._call(Unpark())

    @property
    def parked(self) -> bool:
        return self.worker.parked

    # ---------------------------------------------------------------- state

    def metrics(self, fresh: bool = False) -> EngineMetrics | None:
        """The latest metrics snapshot (refreshed at most every 100 ms while the engine works).

        ``fresh=True`` asks the worker for a snapshot of this moment (it waits for the step in
        flight to end).
        """
        if fresh:
            return self._call(SnapshotMetrics())
        return self.worker.metrics.latest

    def call_on_worker(self, work: Callable[[], T]) -> T:
        """Run ``work`` on the worker thread between two steps and return its result.

        For diagnostics that must touch the device (``engine/loop/diagnostics.py``); it holds up
        every request while it runs.
        """
        return self._call(CallOnWorker(work))

    @property
    def running(self) -> bool:
        """True until ``shutdown`` (or a failure of the worker thread)."""
        return not self._stopping and self._thread.is_alive()

    @property
    def worker_alive(self) -> bool:
        """Whether the worker thread still runs: once it has ended, nothing finishes the requests
        it held (a clean shutdown finishes them first)."""
        return self._thread.is_alive()

    def shutdown(self) -> None:
        """Finish the worker: outstanding requests end with reason 'abort'."""
        if self._stopping:
            return
        self._commands.post(Shutdown())
        self._stopping = True
        self._thread.join()
        self.worker.tiers.close()
        self.catalog.close()
        self.runner.parking.close()
        gc.unfreeze()  # what was frozen at start-up can be collected again

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ---------------------------------------------------------------- commands

    def _call(self, command: Command) -> Any:
        future: Future = Future()
        self._post(command, future)
        return future.result()

    def _post(self, command: Command, future: Future | None = None) -> None:
        if self._stopping:
            raise EngineStopped("the engine has been shut down")
        self._commands.post(command, future)
