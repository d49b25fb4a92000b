"""The batched multi-LoRA engine: one base model, many adapters, one step loop on one thread.

Any thread may submit, abort, add or remove adapters; only the worker thread
touches the device. Its loop is: take commands -> schedule -> run -> postprocess.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import random
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from multilora_studio.adapters.host_cache import HostAdapterCache
from multilora_studio.adapters.peft_adapter import HostAdapter, inspect_peft_adapter, load_peft_adapter
from multilora_studio.adapters.short_lived_workers import call_on_short_lived_thread
from multilora_studio.adapters.slot_table import SlotTable
from multilora_studio.default_model import ProgressCallback
from multilora_studio.engine.block_manager import BlockManager, blocks_needed
from multilora_studio.engine.config import EngineConfig, SamplingParams
from multilora_studio.engine.decode_staging import StagedDecode
from multilora_studio.engine.detokenizer import IncrementalDetokenizer
from multilora_studio.engine.host_threads import loader_threads, quiet_host_threads
from multilora_studio.engine.loader_process import LoaderProcess, staging_buffers_that_fit
from multilora_studio.engine.lora_plan_builder import build_lora_plan, shrink_in_gemm_rows
from multilora_studio.engine.lora_weights import PackedAdapter, max_packed_bytes, pack_adapter
from multilora_studio.engine.mixed_staging import StagedMixed
from multilora_studio.engine.model_source import BaseModel, resolve_model
from multilora_studio.engine.outputs import EngineMetrics, RequestOutput, SlotState, TokenDelta
from multilora_studio.engine.pinned_arena import PinnedArena
from multilora_studio.engine.requests import RequestStream
from multilora_studio.engine.runner import ModelRunner, kv_bytes_per_block
from multilora_studio.engine.sampler import make_generator
from multilora_studio.engine.scheduler import Admission, Scheduler, StepPlan
from multilora_studio.engine.sequence import Sequence as Seq
from multilora_studio.engine.step_trace import StepRecord, StepTrace
from multilora_studio.kernels.jit_watch import compile_count
from multilora_studio.kernels.jit_watch import install as install_compile_watch

log = logging.getLogger(__name__)

Prompt = str | list[int] | list[dict[str, str]]
ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")
CPU_KV_CACHE_CAP_BYTES = 512 << 20
METRICS_INTERVAL_S = 0.1


@dataclass(frozen=True)
class AdapterInfo:
    name: str
    path: Path
    rank: int
    alpha: float
    targets: tuple[str, ...]
    size_bytes: int


@dataclass
class _Active:
    """Worker-side state of one request."""

    seq: Seq
    stream: RequestStream
    detok: IncrementalDetokenizer | None
    generator: torch.Generator | None


def resolve_device(name: str) -> torch.device:
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' was requested but no CUDA GPU is available")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


class Engine:
    """Serve a base model and its LoRA adapters; see the module docstring."""

    def __init__(self, config: EngineConfig | None = None, progress: ProgressCallback | None = None) -> None:
        self.config = config or EngineConfig()
        self.device = resolve_device(self.config.device)
        self.dtype = resolve_dtype(self.config.dtype, self.device)
        self._commands: queue.SimpleQueue[tuple[str, Any, Future | None]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._adapters: dict[str, AdapterInfo] = {}
        self._active: dict[str, _Active] = {}
        self._wanted: Counter[str | None] = Counter()  # adapter -> its queued and running requests
        self._stopping = False
        self._ready: Future[None] = Future()
        self._step_listeners: list[Callable[[EngineMetrics], None]] = []
        self._request_counter = itertools.count()
        self._generated = 0
        self._rate_window: list[tuple[float, int]] = []
        self._last_metrics_time = 0.0
        self._metrics: EngineMetrics | None = None
        self._gpu_hits = 0
        self._gpu_misses = 0
        self._preemptions = 0
        self._phase_seconds = dict.fromkeys(
            ("schedule", "prepare", "launch", "sample", "postprocess", "steps"), 0.0
        )
        self._last_batch = (0, 0, 0)
        self.step_trace = StepTrace()  # the recent steps, for benchmarks and diagnosis
        self._last_step_end = 0.0
        self._loader_process: LoaderProcess | None = None
        self._thread = threading.Thread(
            target=self._worker_main, args=(progress,), name="engine-worker", daemon=True
        )
        self._thread.start()
        self._ready.result()

    # ---------------------------------------------------------------- setup (worker thread)

    def _worker_main(self, progress: ProgressCallback | None) -> None:
        try:
            self._setup(progress)
        except BaseException as error:
            if self._loader_process is not None:
                self._loader_process.close()
                self._loader_process = None
            self._ready.set_exception(error)
            return
        self._ready.set_result(None)
        self._loop()

    def _setup(self, progress: ProgressCallback | None) -> None:
        config = self.config
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            quiet_host_threads()
            install_compile_watch()
        plan = build_lora_plan(config, self.device, self.dtype)  # how the LoRA term runs
        lora_rows = shrink_in_gemm_rows(config, plan)  # A rows reserved after every GEMM weight
        base: BaseModel = resolve_model(config.model, self.dtype, self.device, progress, lora_rows)
        self.base = base
        self.spec = base.spec
        self.tokenizer = base.tokenizer
        self.model_name = base.name
        self.base_digest = base.digest
        if config.max_model_len > base.spec.max_position_embeddings:
            log.warning(
                "max_model_len %d exceeds the model's max_position_embeddings %d",
                config.max_model_len,
                base.spec.max_position_embeddings,
            )
        num_blocks = self._kv_blocks(base)
        self.runner = ModelRunner(config, base.spec, base.weights, num_blocks, self.device, self.dtype, plan)
        self.blocks = BlockManager(num_blocks, config.block_size)
        self.slots = SlotTable(config.max_loras)
        assert config.max_cpu_loras is not None
        # host bytes of one adapter of max_lora_rank on every projection: a pinned block, a staging buffer
        block_bytes = max_packed_bytes(self.spec, config.max_lora_rank, self.dtype)
        self.adapter_loader, self._load_workers = self._choose_loader(block_bytes)
        self.host_cache: HostAdapterCache[PackedAdapter] = HostAdapterCache(
            config.max_cpu_loras, self._load_adapter, self._wake.set, self._load_workers
        )
        self._upload_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        # Slot uploads in flight: the event that completes them, and the host copy they read
        # (kept alive, with its pinned block, until the copies have completed).
        self._uploads: dict[str, tuple[torch.cuda.Event, PackedAdapter]] = {}
        self._arena = self._pinned_arena(block_bytes, config.max_cpu_loras)
        if self.adapter_loader == "process":
            self._loader_process = LoaderProcess(
                self.spec, config.max_lora_rank, self.dtype, block_bytes, self._load_workers
            )
        self._compiles_at_start = compile_count()  # after the warm-up and the graph captures
        self.scheduler = Scheduler(
            self.blocks,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            self._acquire_adapter,
            self._release_adapter,
        )

    def _kv_blocks(self, base: BaseModel) -> int:
        config = self.config
        per_block = kv_bytes_per_block(base.spec, config.block_size, self.dtype)
        per_seq = blocks_needed(config.max_model_len, config.block_size)
        wanted = config.max_num_seqs * per_seq
        if config.kv_cache_memory_gb is not None:
            budget = int(config.kv_cache_memory_gb * (1 << 30))
        elif self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            budget = int(free * 0.85) - (2 << 30)
        else:
            budget = CPU_KV_CACHE_CAP_BYTES
        blocks = min(wanted, budget // per_block)
        if blocks < per_seq:
            raise ValueError(
                f"the KV cache ({budget / 2**30:.2f} GiB) cannot hold one sequence of max_model_len="
                f"{config.max_model_len} tokens ({per_seq * per_block / 2**30:.2f} GiB); lower "
                "max_model_len or raise kv_cache_memory_gb"
            )
        return blocks

    # ---------------------------------------------------------------- adapters (any thread)

    def _read_adapter(self, name: str, path: Path) -> HostAdapter:
        spec = self.spec
        return load_peft_adapter(
            name,
            path,
            spec.num_layers,
            spec.projection_shape,
            self.config.max_lora_rank,
            spec.vocab_size,
            dtype=self.dtype,
        )

    def _load_adapter(self, name: str, path: Path) -> PackedAdapter:
        """Disk -> host tier: validate, then lay out in slot format (pinned for fast uploads)."""
        with loader_threads(self.device.type):
            if self._loader_process is not None:
                return self._loader_process.load(name, path, self._arena, pin=self.device.type == "cuda")
            return self._pack(self._read_adapter(name, path))

    def _read_and_pack(self, name: str, path: Path) -> tuple[HostAdapter, PackedAdapter]:
        with loader_threads(self.device.type):
            host = self._read_adapter(name, path)
            return host, self._pack(host)

    def _pack(self, adapter: HostAdapter) -> PackedAdapter:
        return pack_adapter(adapter, self.spec, self.dtype, pin=self.device.type == "cuda", arena=self._arena)

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
        """Pinned blocks of ``block_bytes`` for the host tier on CUDA: one per host slot, one
        per load in flight and one more for an upload in flight."""
        if self.device.type != "cuda":
            return None
        return PinnedArena.for_tier(block_bytes, host_slots + self._load_workers + 1)

    def add_adapter(self, name: str, path: str | Path, preload: bool = True) -> AdapterInfo:
        """Validate the PEFT folder at ``path`` and make it servable as ``name``.

        ``preload=False`` checks the config and the safetensors header only and reads the
        weights on first use (for libraries of many adapters); a problem only the weights can
        show (NaN/Inf) then fails that adapter's requests with the validation message.
        """
        if not isinstance(name, str) or not ADAPTER_NAME.match(name) or name in ("base", self.model_name):
            raise ValueError(
                f"invalid adapter name {name!r}: use 1-128 letters, digits or ._:/@+- "
                "(and not 'base' or the base model's name)"
            )
        with self._lock:
            if name in self._adapters:
                raise ValueError(f"an adapter named {name!r} already exists; remove it first")
        path = Path(path)
        packed = None
        if preload:
            # On a thread that ends with the load: see adapters/short_lived_workers.py.
            host, packed = call_on_short_lived_thread(lambda: self._read_and_pack(name, path))
            info = AdapterInfo(name, path, host.rank, host.alpha, host.targets, host.nbytes)
        else:
            spec = self.spec
            summary = inspect_peft_adapter(
                path, spec.num_layers, spec.projection_shape, self.config.max_lora_rank, spec.vocab_size
            )
            info = AdapterInfo(name, path, summary.rank, summary.alpha, summary.targets, summary.size_bytes)
        with self._lock:
            if name in self._adapters:
                raise ValueError(f"an adapter named {name!r} already exists; remove it first")
            self._adapters[name] = info
        if packed is not None:
            self.host_cache.put(packed)
        return info

    def remove_adapter(self, name: str) -> None:
        """Forget ``name``; refused while requests for it are queued or running."""
        self._call("remove_adapter", name)

    def prefetch_adapters(self, names: Sequence[str], timeout: float | None = None) -> dict[str, str | None]:
        """Read ``names`` into the host tier ahead of their first request and wait for them.

        Loads run as requests' loads do (``adapter_load_workers`` at once). Returns each
        name's load error, or None once it is in host RAM. Raises ValueError for a name never
        added or more names than ``max_cpu_loras``, and TimeoutError when ``timeout``
        seconds pass first. Host-tier hits are not counted for the prefetch itself.
        """
        capacity = self.host_cache.capacity
        if len(names) > capacity:
            raise ValueError(f"{len(names)} adapters do not fit the host tier of {capacity} (max_cpu_loras)")
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

    def pin_adapter(self, name: str, pinned: bool = True) -> None:
        """Keep ``name`` in its GPU slot once loaded (or let it be evicted again)."""
        self._call("pin_adapter", (name, pinned))

    def list_adapters(self) -> list[AdapterInfo]:
        with self._lock:
            return list(self._adapters.values())

    def _call(self, command: str, payload: Any) -> Any:
        future: Future = Future()
        self._post(command, payload, future)
        return future.result()

    def _post(self, command: str, payload: Any, future: Future | None = None) -> None:
        if self._stopping:
            raise RuntimeError("the engine has been shut down")
        self._commands.put((command, payload, future))
        self._wake.set()

    # ---------------------------------------------------------------- requests (any thread)

    def encode(self, prompt: Any) -> list[int]:
        """Token ids of a text prompt, chat messages (through the chat template) or ids as given."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer; pass token ids")
            return list(self.tokenizer(prompt).input_ids)
        if isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
            if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
                raise ValueError("this model has no chat template; pass a plain prompt")
            for message in prompt:
                if not isinstance(message.get("role"), str) or not isinstance(message.get("content"), str):
                    raise ValueError("each chat message needs string 'role' and 'content' fields")
            text = self.tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
            return list(self.tokenizer(text, add_special_tokens=False).input_ids)
        if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            bad = [t for t in prompt if not 0 <= t < self.spec.vocab_size]
            if bad:
                raise ValueError(f"token ids out of range [0, {self.spec.vocab_size}): {bad[:5]}")
            return list(prompt)
        raise ValueError("a prompt is a string, a list of token ids or a list of chat messages")

    def submit(
        self,
        prompt: Prompt,
        adapter: str | None = None,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> RequestStream:
        """Queue one request; returns its stream at once."""
        seq, stream = self._prepare(prompt, adapter, params, request_id, loop)
        self._post("add", [(seq, stream)])
        return stream

    def submit_many(
        self, requests: Sequence[tuple[Prompt, str | None, SamplingParams | None]]
    ) -> list[RequestStream]:
        """Queue several requests at once: they reach the scheduler together (one batch).

        All are validated first; if one is refused (ValueError), none is queued.
        """
        prepared = [
            self._prepare(prompt, adapter, params, None, None) for prompt, adapter, params in requests
        ]
        self._post("add", prepared)
        return [stream for _, stream in prepared]

    def _prepare(
        self,
        prompt: Prompt,
        adapter: str | None,
        params: SamplingParams | None,
        request_id: str | None,
        loop: asyncio.AbstractEventLoop | None,
    ) -> tuple[Seq, RequestStream]:
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError("params must be a SamplingParams")
        token_ids = self.encode(prompt)
        if not token_ids:
            raise ValueError("the prompt is empty")
        if len(token_ids) >= self.config.max_model_len:
            raise ValueError(
                f"the prompt has {len(token_ids)} tokens; max_model_len is {self.config.max_model_len}"
            )
        if adapter is not None:
            with self._lock:
                if adapter not in self._adapters:
                    names = sorted(self._adapters)
                    known = ", ".join(names[:20]) + (
                        f" and {len(names) - 20} more" if len(names) > 20 else ""
                    )
                    raise ValueError(f"unknown adapter {adapter!r} (known: {known or 'none'})")
        request_id = request_id or f"req-{next(self._request_counter)}-{uuid.uuid4().hex[:8]}"
        output = RequestOutput(request_id, adapter, token_ids, arrival_time=time.monotonic())
        stream = RequestStream(output, loop)
        seq = Seq(request_id, token_ids, adapter, params, arrival_step=0)
        return seq, stream

    def abort(self, request_id: str) -> None:
        """Stop a request; it finishes with reason 'abort' and its KV blocks are freed."""
        self._post("abort", request_id)

    def generate(
        self,
        prompts: Sequence[Prompt],
        adapter_names: Sequence[str | None] | None = None,
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run all prompts together (one batch) and return their outputs in order."""
        prompts = list(prompts)
        names = list(adapter_names) if adapter_names is not None else [None] * len(prompts)
        if len(names) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(names)} adapter names")
        per_request = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        if len(per_request) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(per_request)} sampling params")
        streams = self.submit_many(list(zip(prompts, names, per_request, strict=True)))
        return [stream.result() for stream in streams]

    def stream(
        self, prompt: Prompt, adapter: str | None = None, params: SamplingParams | None = None
    ) -> Iterator[TokenDelta]:
        """Token deltas of one request, for a thread; closing the iterator early aborts it."""
        handle = self.submit(prompt, adapter, params)
        finished = False
        try:
            for delta in handle:
                finished = delta.finished
                yield delta
        finally:
            if not finished:
                self.abort(handle.request_id)

    async def astream(
        self, prompt: Prompt, adapter: str | None = None, params: SamplingParams | None = None
    ) -> AsyncIterator[TokenDelta]:
        """Token deltas of one request, for asyncio; cancelling the consumer aborts it."""
        handle = self.submit(prompt, adapter, params, loop=asyncio.get_running_loop())
        finished = False
        try:
            async for delta in handle:
                finished = delta.finished
                yield delta
        finally:
            if not finished:
                self.abort(handle.request_id)

    def metrics(self, fresh: bool = False) -> EngineMetrics | None:
        """The latest metrics snapshot (refreshed at most every 100 ms while the engine works).

        ``fresh=True`` asks the worker for a snapshot of this moment (it waits for the step in
        flight to end).
        """
        if fresh:
            return self._call("metrics", None)
        return self._metrics

    @property
    def running(self) -> bool:
        """True until ``shutdown`` (or a failure of the worker thread)."""
        return not self._stopping and self._thread.is_alive()

    def shutdown(self) -> None:
        """Finish the worker: outstanding requests end with reason 'abort'."""
        if self._stopping:
            return
        self._commands.put(("shutdown", None, None))
        self._stopping = True
        self._wake.set()
        self._thread.join()
        if hasattr(self, "host_cache"):
            self.host_cache.close()
        if self._loader_process is not None:
            self._loader_process.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ---------------------------------------------------------------- worker loop

    def _loop(self) -> None:
        while True:
            self._wake.clear()
            if not self._drain_commands():
                return
            self._fail_unloadable_adapters()
            if not self.scheduler.has_work:
                self._publish_metrics(force=True)
                self._wake.wait()
                continue
            started = time.perf_counter()
            plan = self.scheduler.schedule()
            scheduled = time.perf_counter()
            self._phase_seconds["schedule"] += scheduled - started
            self._preemptions += len(plan.preempted)
            if not plan.chunks:
                # waiting for an adapter to arrive from disk (the loader wakes us) or to upload
                self._wake.wait(0.002 if self._uploads else 0.05)
                continue
            self._run_step(plan, started, scheduled)

    def _run_step(self, plan: StepPlan, scheduling_started: float, scheduled: float) -> None:
        try:
            slot_of: dict[str | None, int] = {None: -1}
            for chunk in plan.chunks:
                name = chunk.seq.adapter
                if name is not None and name not in slot_of:
                    slot = self.slots.slot_of(name)
                    if slot is None:
                        raise RuntimeError(f"adapter {name} lost its slot while running")
                    slot_of[name] = slot
            t_prepare = time.perf_counter()
            inputs = self.runner.prepare(plan, self.blocks, slot_of)
            graph = isinstance(inputs, (StagedDecode, StagedMixed))
            t_launch = self._tick("prepare", t_prepare)
            logits = self.runner.run(inputs)
            t_sample = self._tick("launch", t_launch)
            sampling = [c for c in plan.chunks if c.completes]
            actives = [self._active[c.seq.request_id] for c in sampling]
            tokens = self.runner.sample(
                logits, [a.seq.params for a in actives], [a.generator for a in actives]
            )
            t_post = self._tick("sample", t_sample)
        except Exception as error:
            log.exception("step failed")
            for chunk in plan.chunks:
                self._finish(chunk.seq.request_id, "error", f"engine step failed: {error}")
            return
        for chunk in plan.chunks:
            chunk.seq.num_computed_tokens += chunk.num_tokens
        now = time.monotonic()
        for chunk, token in zip(sampling, tokens, strict=True):
            self._append_token(self._active[chunk.seq.request_id], token, now)
        self._generated += len(tokens)
        self._rate_window.append((now, len(tokens)))
        adapters = {c.seq.adapter for c in plan.chunks}
        self._last_batch = (plan.num_tokens, len(plan.chunks), len(adapters - {None}))
        self._publish_metrics()
        end = self._tick("postprocess", t_post)
        self._phase_seconds["steps"] += 1
        self.step_trace.record(
            StepRecord(
                start=t_prepare,
                schedule_s=scheduled - scheduling_started,
                gap_s=max(0.0, scheduling_started - self._last_step_end),
                prepare_s=t_launch - t_prepare,
                launch_s=t_sample - t_launch,
                sample_s=t_post - t_sample,
                post_s=end - t_post,
                tokens=plan.num_tokens,
                sequences=len(plan.chunks),
                prompt_tokens=sum(c.num_tokens for c in plan.chunks if c.num_tokens > 1),
                lora_sequences=sum(c.seq.adapter is not None for c in plan.chunks),
                graph=graph,
                uploads_in_flight=len(self._uploads),
            )
        )
        self._last_step_end = end

    def _tick(self, phase: str, since: float) -> float:
        now = time.perf_counter()
        self._phase_seconds[phase] += now - since
        return now

    def step_profile(self) -> dict[str, float]:
        """Cumulative seconds the worker spent per phase of its steps, and the step count.

        ``launch`` is host time to enqueue the forward pass; on CUDA the device time shows up
        in ``sample``, which waits for the logits.
        """
        return dict(self._phase_seconds)

    def time_decode_graph(self, batch: int, uses_lora: bool, iters: int = 50) -> float:
        """Device milliseconds of one replay of the decode graph for ``batch`` (CUDA only)."""
        return self._call("time_graph", (batch, uses_lora, iters))

    def time_slot_upload(self, name: str) -> dict[str, float]:
        """Re-upload a resident, idle adapter into its own slot and time it (CUDA only).

        Returns the upload's device milliseconds, those of one plain pinned host-to-device
        copy of the same number of bytes, and the bytes.
        """
        return self._call("time_upload", name)

    def _time_upload(self, name: str) -> dict[str, float]:
        slot, packed = self.slots.slot_of(name), self.host_cache.get(name)
        if self._upload_stream is None or slot is None or packed is None or self.slots.in_use(name):
            raise ValueError(f"{name!r} must be resident in a GPU slot and host RAM, idle, on CUDA")
        stream = self._upload_stream

        def timed(work: Callable[[], object]) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(stream):
                start.record(stream)
                work()
                end.record(stream)
            end.synchronize()
            return start.elapsed_time(end)

        source = torch.empty(packed.nbytes, dtype=torch.uint8).pin_memory()
        target = torch.empty(packed.nbytes, dtype=torch.uint8, device=self.device)
        timed(lambda: target.copy_(source, non_blocking=True))  # warm-up
        timed(lambda: self.runner.lora.upload(slot, packed))
        return {
            "upload_ms": timed(lambda: self.runner.lora.upload(slot, packed)),
            "pinned_copy_ms": timed(lambda: target.copy_(source, non_blocking=True)),
            "bytes": float(packed.nbytes),
        }

    def _append_token(self, active: _Active, token: int, now: float) -> None:
        seq, output = active.seq, active.stream.output
        seq.output_token_ids.append(token)
        if output.first_token_time is None:
            output.first_token_time = now
        params = seq.params
        reason = None
        stopped_by_text = active.detok.add(token) if active.detok is not None else False
        if (
            stopped_by_text
            or token in params.stop_token_ids
            or (not params.ignore_eos and token in self.spec.eos_token_ids)
        ):
            reason = "stop"
        elif len(seq.output_token_ids) >= params.max_tokens or seq.num_tokens >= self.config.max_model_len:
            reason = "length"
        if reason is not None:
            self._finish(seq.request_id, reason, None, pending=[token])
        else:
            text = active.detok.delta(finished=False) if active.detok is not None else ""
            active.stream.push(TokenDelta(seq.request_id, [token], text))

    def _finish(
        self, request_id: str, reason: str, error: str | None, pending: list[int] | None = None
    ) -> None:
        active = self._active.pop(request_id, None)
        if active is None:
            return
        self._wanted[active.seq.adapter] -= 1
        if not self._wanted[active.seq.adapter]:
            del self._wanted[active.seq.adapter]
        seq, output = active.seq, active.stream.output
        if not seq.is_finished:
            self.scheduler.finish(seq, reason)
        text = active.detok.delta(finished=True) if active.detok is not None else ""
        output.token_ids = list(seq.output_token_ids)
        output.text = active.detok.text if active.detok is not None else ""
        output.finish_reason = reason
        output.error = error
        output.finish_time = time.monotonic()
        active.stream.push(TokenDelta(request_id, pending or [], text, True, reason, error))

    def _drain_commands(self) -> bool:
        while True:
            try:
                command, payload, future = self._commands.get_nowait()
            except queue.Empty:
                return True
            if command == "shutdown":
                for request_id in list(self._active):
                    self._finish(request_id, "abort", "the engine was shut down")
                return False
            try:
                result = self._handle(command, payload)
            except Exception as error:
                if future is None:
                    log.exception("command %s failed", command)
                else:
                    future.set_exception(error)
            else:
                if future is not None:
                    future.set_result(result)

    def _handle(self, command: str, payload: Any) -> Any:
        if command == "add":
            for seq, stream in payload:
                seq.arrival_step = self.scheduler.step_count
                detok = IncrementalDetokenizer(self.tokenizer, seq.params.stop) if self.tokenizer else None
                generator = make_generator(seq.params, self.device, random.getrandbits(63))
                self._active[seq.request_id] = _Active(seq, stream, detok, generator)
                self._wanted[seq.adapter] += 1
                self.scheduler.add(seq)
            return None
        if command == "abort":
            self._finish(payload, "abort", None)
            return None
        if command == "remove_adapter":
            return self._remove_adapter(payload)
        if command == "metrics":
            self._publish_metrics(force=True)
            return self._metrics
        if command == "time_upload":
            return self._time_upload(payload)
        if command == "time_graph":
            if self.runner.graphs is None:
                raise ValueError("decode graphs are not in use (CPU device or enforce_eager)")
            return self.runner.graphs.time_replay(*payload)
        if command == "pin_adapter":
            name, pinned = payload
            with self._lock:
                if name not in self._adapters:
                    raise ValueError(f"unknown adapter {name!r}")
            (self.slots.pin if pinned else self.slots.unpin)(name)
            return None
        raise ValueError(f"unknown engine command {command!r}")

    def _remove_adapter(self, name: str) -> None:
        with self._lock:
            if name not in self._adapters:
                raise ValueError(f"unknown adapter {name!r}")
        users = [a.seq.request_id for a in self._active.values() if a.seq.adapter == name]
        if users:
            raise ValueError(f"adapter {name!r} is used by {len(users)} queued or running requests")
        upload = self._uploads.pop(name, None)
        if upload is not None:
            upload[0].synchronize()
            self.slots.release(name)
        slot = self.slots.evict(name)
        if slot is not None:
            self.runner.lora.clear(slot)
        self.host_cache.discard(name)
        with self._lock:
            del self._adapters[name]

    # ---------------------------------------------------------------- adapter residency (worker)

    def _acquire_adapter(self, name: str | None) -> Admission:
        """Give a request its adapter's slot, or say why it must wait.

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
                self.slots.release(name)
            else:
                self._gpu_hits += 1
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
            if host.holds(name) or host.loads_in_flight >= self._load_workers:
                return Admission.NO_SLOT
            victim = host.eviction_candidate()
            if victim is not None and victim in self._wanted:
                return Admission.NO_SLOT  # it would push out an adapter that a request waits for
            host.lookup(name, info.path)
            return Admission.LOADING
        packed = self.host_cache.lookup(name, info.path)
        if packed is None:
            return Admission.LOADING
        acquired = self.slots.acquire(name)
        if acquired is None:
            return Admission.NO_SLOT
        self._gpu_misses += 1
        if acquired.evicted is not None:
            log.debug("slot %d: %s evicted for %s", acquired.slot, acquired.evicted, name)
        if self._upload_stream is None:
            self.runner.lora.upload(acquired.slot, packed)
            return Admission.READY
        with torch.cuda.stream(self._upload_stream):
            self.runner.lora.upload(acquired.slot, packed)
            done = torch.cuda.Event()
            done.record(self._upload_stream)
        self._uploads[name] = (done, packed)  # keeps the slot until the copy has landed
        return Admission.LOADING

    def _release_adapter(self, name: str | None) -> None:
        if name is not None:
            self.slots.release(name)

    def _fail_unloadable_adapters(self) -> None:
        for request_id, active in list(self._active.items()):
            name = active.seq.adapter
            if name is None or active.seq.status.value != "waiting":
                continue
            error = self.host_cache.error_of(name)
            if error is not None:
                self._finish(request_id, "error", f"adapter {name!r} could not be loaded: {error}")

    # ---------------------------------------------------------------- metrics (worker)

    def _publish_metrics(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_metrics_time < METRICS_INTERVAL_S:
            return
        self._last_metrics_time = now
        self._rate_window = [(t, n) for t, n in self._rate_window if now - t <= 2.0]
        span = now - self._rate_window[0][0] if len(self._rate_window) > 1 else 0.0
        rate = sum(n for _, n in self._rate_window[1:]) / span if span > 0 else 0.0
        if not self.scheduler.has_work:
            rate = 0.0  # idle: nothing is being generated now
        counters = self.host_cache.counters
        memory = torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else 0
        tokens, size, distinct = self._last_batch
        compiled = compile_count()
        self._metrics = EngineMetrics(
            state="running" if self.scheduler.has_work else "idle",
            device=str(self.device),
            steps=self.scheduler.step_count,
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            batch_tokens=tokens,
            batch_size=size,
            distinct_adapters=distinct,
            tokens_per_second=rate,
            total_generated_tokens=self._generated,
            kv_blocks_total=self.blocks.num_blocks,
            kv_blocks_free=self.blocks.num_free,
            preemptions=self._preemptions,
            slots=tuple(SlotState(s.slot, s.adapter, s.pinned, s.in_use) for s in self.slots.snapshot()),
            cpu_adapters=tuple(self.host_cache.names()),
            gpu_hits=self._gpu_hits,
            gpu_misses=self._gpu_misses,
            cpu_hits=counters.hits,
            cpu_misses=counters.misses,
            cold_load_p50_s=counters.percentile(0.5),
            cold_load_p95_s=counters.percentile(0.95),
            device_memory_bytes=memory,
            adapter_loader=self.adapter_loader,
            adapter_load_workers=self._load_workers,
            pinned_blocks_exhausted=0 if self._arena is None else self._arena.exhausted,
            kernel_compiles=compiled.compiles - self._compiles_at_start.compiles,
            kernel_compile_s=compiled.seconds - self._compiles_at_start.seconds,
        )
