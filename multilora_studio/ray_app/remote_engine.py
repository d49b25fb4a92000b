"""The two sides of an engine on Ray Serve: ``EngineReplica`` (a deployment replica holding one
engine) and ``RemoteEngine`` (the ingress's ``ServingEngine`` over the replicas' handle).

An adapter's requests carry its name as Ray's multiplexed model id, so Ray routes them to
replicas that have it loaded (``@serve.multiplexed``, an LRU of ``least_host_capacity``
adapters per replica: ``max_cpu_loras``, or its automatic size's floor). Each registration of
a name at the ingress has its own token: a replica that loaded an earlier adapter of that name
reloads before it serves the new one, so a re-registered name never runs on stale weights.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from ray import serve
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from ray.serve.metrics import Gauge

from multilora_studio.engine import (
    AdapterInfo,
    Engine,
    EngineConfig,
    EngineStopped,
    InvalidRequest,
    RequestOutput,
    RequestStream,
    SamplingParams,
    TokenDelta,
)
from multilora_studio.engine.loop.request_methods import NewRequest
from multilora_studio.engine.model.model_spec import ModelSpec
from multilora_studio.engine.serving_engine import ServingEngine
from multilora_studio.engine.text.chat_tokens import Render, render_in_process
from multilora_studio.engine.text.prompts import encode_prompt
from multilora_studio.engine.text.template_sandbox import TemplateSandbox
from multilora_studio.server.metrics import GAUGES

METRICS_INTERVAL_S = 1.0


@dataclass(frozen=True)
class EngineFacts:
    """What the ingress needs to know of the replicas' base (the same on every replica)."""

    config: EngineConfig
    spec: ModelSpec
    model_name: str
    base_digest: str
    model_folder: Path | None
    device: torch.device
    dtype: torch.dtype
    tokenizer: Any


@dataclass(frozen=True)
class AdapterFacts:
    """One adapter as a replica validated it: its info, vocabulary and own tokenizer (or None)."""

    info: AdapterInfo
    vocab_size: int
    tokenizer: Any


@dataclass(frozen=True)
class RequestTotals:
    """What a replica's engine measured of a request and its deltas do not carry: its share of
    the engine's busy time, its adapter's tier when it arrived, its time in the queue and its
    cached prompt tokens. The replica sends it just before the finishing delta, so the ingress's
    output is whole when that delta ends the request (usage behind Ray bills the replicas'
    engine time)."""

    engine_seconds: float
    adapter_tier: str | None
    queue_s: float | None
    num_cached_tokens: int = 0

    @classmethod
    def of(cls, output: RequestOutput) -> RequestTotals:
        return cls(output.engine_seconds, output.adapter_tier, output.queue_time, output.num_cached_tokens)

    def apply(self, output: RequestOutput) -> None:
        """Onto the ingress's output (its queue time counted from the ingress's arrival)."""
        output.engine_seconds, output.adapter_tier = self.engine_seconds, self.adapter_tier
        output.num_cached_tokens = self.num_cached_tokens
        if self.queue_s is not None:
            output.first_scheduled_time = output.arrival_time + self.queue_s


@dataclass(frozen=True)
class Registration:
    """An adapter served at the ingress under one name: its folder and this registration's token."""

    path: str
    token: str
    facts: AdapterFacts


def engine_replica_class(adapters_per_replica: int) -> type:
    """The replica deployment's class, its multiplexed LRU sized ``adapters_per_replica``."""

    class EngineReplica:
        """One engine; exports its metrics snapshot through Ray's metrics (Prometheus)."""

        def __init__(self, config: EngineConfig) -> None:
            self.engine = Engine(config)
            self._loaded: dict[str, str] = {}  # adapter -> the registration token it was loaded under
            self._lock = threading.Lock()
            self._gauges = {name: Gauge(name, description=doc) for name, doc, _ in GAUGES}
            self._loads = Gauge("multilora_adapter_disk_loads", description="Adapters read from disk")
            threading.Thread(target=self._export_metrics, name="ray-metrics", daemon=True).start()

        def facts(self) -> EngineFacts:
            engine = self.engine
            return EngineFacts(
                engine.config,
                engine.spec,
                engine.model_name,
                engine.base_digest,
                engine.model_folder,
                engine.device,
                engine.dtype,
                engine.tokenizer,
            )

        def describe_adapter(self, name: str, path: str) -> AdapterFacts:
            """Validate an adapter folder for this base (config and safetensors header, as
            ``Engine.add_adapter(preload=False)``) without keeping it registered."""
            probe = f"probe-{uuid.uuid4().hex[:12]}"
            info = self.engine.add_adapter(probe, path, preload=False)
            try:
                own = self.engine.tokenizer_for(probe)
                tokenizer = own if own is not self.engine.tokenizer else None
                return AdapterFacts(
                    AdapterInfo(**{**info.__dict__, "name": name}),
                    self.engine.vocab_size_of(probe),
                    tokenizer,
                )
            finally:
                self.engine.remove_adapter(probe)

        @serve.multiplexed(max_num_models_per_replica=adapters_per_replica)
        async def adapter(self, name: str) -> str:
            """Ray's multiplexed loader: called when this replica takes a request for ``name``
            that its LRU does not hold (the load itself happens in ``_hold``)."""
            return name

        def _hold(self, name: str, path: str, token: str) -> None:
            """Serve registration ``token`` of ``name`` (its weights read by its first request),
            replacing an earlier registration of the name (refused while that one's requests run)."""
            with self._lock:
                if self._loaded.get(name) == token:
                    return
                if name in self._loaded:
                    self.engine.remove_adapter(name)
                    del self._loaded[name]
                self.engine.add_adapter(name, path, preload=False)  # read by its first request
                self._loaded[name] = token

        async def generate(
            self,
            token_ids: list[int],
            adapter: str | None,
            registration: tuple[str, str] | None,
            params: SamplingParams,
            request_id: str,
        ) -> AsyncIterator[TokenDelta | RequestTotals]:
            """The request's deltas, its ``RequestTotals`` just before the last; cancelling the
            call aborts the engine request."""
            if adapter is not None and registration is not None:
                if serve.get_multiplexed_model_id() != adapter:
                    raise ValueError(
                        f"request for {adapter!r} routed as {serve.get_multiplexed_model_id()!r}"
                    )
                await self.adapter(adapter)
                if self._loaded.get(adapter) != registration[1]:
                    await asyncio.to_thread(self._hold, adapter, *registration)
            loop = asyncio.get_running_loop()
            stream = self.engine.submit(token_ids, adapter, params, request_id, loop)
            finished = False
            try:
                async for delta in stream:
                    finished = delta.finished
                    if finished:
                        yield RequestTotals.of(stream.output)
                    yield delta
            finally:
                if not finished:
                    self.engine.abort(request_id)

        def holdings(self) -> dict[str, Any]:
            """This replica's id, the adapters in its host tier, its reads from disk and its
            engine's busy seconds."""
            snap = self.engine.metrics(fresh=True)
            return {
                "replica": serve.get_replica_context().replica_id.unique_id,
                "host_tier": list(snap.cpu_adapters) if snap is not None else [],
                "disk_loads": snap.cpu_misses if snap is not None else 0,
                "busy_seconds": snap.busy_seconds if snap is not None else 0.0,
            }

        def _export_metrics(self) -> None:
            while self.engine.running:
                snap = self.engine.metrics()
                if snap is not None:
                    for name, _, reading in GAUGES:
                        self._gauges[name].set(reading(snap))
                    self._loads.set(snap.cpu_misses)
                time.sleep(METRICS_INTERVAL_S)

        def __del__(self) -> None:
            self.engine.shutdown()

    return EngineReplica


class RemoteEngine(ServingEngine):
    """The ingress's engine: requests stream from the replica Ray routes them to; prompts are
    tokenized here (with the base's or the adapter's own tokenizer); adapters are validated by
    a replica when registered and loaded by a replica when its first request reaches it.

    Differences from a local engine: a request a replica refuses (a bad sampling value the
    server's checks let through) ends with reason 'error' instead of raising at submit;
    ``metrics()`` is None here (each replica exports its own through Ray); pinning is refused.
    A finished output's engine seconds, adapter tier and queue time are the replica's
    (``RequestTotals``).
    """

    def __init__(self, handle: DeploymentHandle, facts: EngineFacts) -> None:
        self._handle = handle
        self.config, self.spec, self.tokenizer = facts.config, facts.spec, facts.tokenizer
        self.model_name, self.base_digest = facts.model_name, facts.base_digest
        self.model_folder, self.device, self.dtype = facts.model_folder, facts.device, facts.dtype
        self._lock = threading.Lock()  # guards the three below
        self._adapters: dict[str, Registration] = {}
        self._in_flight: Counter[str] = Counter()
        self._pumps: dict[str, concurrent.futures.Future[None]] = {}
        self._request_counter = itertools.count()
        self._template_sandbox = TemplateSandbox(self.config.max_model_len)  # adapters' own templates
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="remote-engine", daemon=True)
        self._thread.start()
        self._running = True

    # ---------------------------------------------------------------- adapters

    def add_adapter(self, name: str, path: str | Path, preload: bool = True) -> AdapterInfo:
        """Validated by a replica now; read by each replica its requests reach (``preload`` has
        no other meaning here)."""
        with self._lock:
            if name in self._adapters:
                raise ValueError(f"an adapter named {name!r} is already served")
        facts: AdapterFacts = self._handle.describe_adapter.remote(name, str(path)).result()
        self.register(name, str(path), facts)
        return facts.info

    def register(self, name: str, path: str, facts: AdapterFacts) -> None:
        """Serve an adapter a replica has validated (``describe_adapter``) as ``name``."""
        with self._lock:
            if name in self._adapters:
                raise ValueError(f"an adapter named {name!r} is already served")
            self._adapters[name] = Registration(path, uuid.uuid4().hex, facts)

    def remove_adapter(self, name: str) -> None:
        with self._lock:
            if name not in self._adapters:
                raise ValueError(f"no adapter named {name!r}")
            if self._in_flight[name]:
                raise ValueError(f"adapter {name!r} has {self._in_flight[name]} requests in flight")
            del self._adapters[name]

    def prefetch_adapters(self, names: Sequence[str], timeout: float | None = None) -> dict[str, str | None]:
        """Each adapter loaded on the replica Ray routes its id to (one short request each)."""
        results: dict[str, str | None] = {}
        prime = SamplingParams(max_tokens=1, temperature=0.0)
        for name in names:
            stream = self.submit([self.spec.eos_token_ids[0] if self.spec.eos_token_ids else 0], name, prime)
            output = stream.result(timeout)
            results[name] = output.error if output.finish_reason == "error" else None
        return results

    def list_adapters(self) -> list[AdapterInfo]:
        with self._lock:
            return [registration.facts.info for registration in self._adapters.values()]

    def has_adapter(self, name: str) -> bool:
        with self._lock:
            return name in self._adapters

    def _registration(self, adapter: str | None) -> Registration | None:
        if adapter is None:
            return None
        with self._lock:
            registration = self._adapters.get(adapter)
        if registration is None:
            raise ValueError(f"unknown adapter {adapter!r}")
        return registration

    # ---------------------------------------------------------------- prompts

    def tokenizer_for(self, adapter: str | None) -> Any:
        registration = self._registration(adapter)
        own = registration.facts.tokenizer if registration is not None else None
        return own if own is not None else self.tokenizer

    def renderer_for(self, adapter: str | None) -> Render:
        """An adapter's own template renders in the sandbox (``Engine.renderer_for``)."""
        registration = self._registration(adapter)
        own = registration.facts.tokenizer if registration is not None else None
        return render_in_process if own is None else self._template_sandbox.render

    def vocab_size_of(self, adapter: str | None) -> int:
        registration = self._registration(adapter)
        return registration.facts.vocab_size if registration is not None else self.spec.vocab_size

    def encode(
        self, prompt: Any, special_tokens_in_content: bool = False, adapter: str | None = None
    ) -> list[int]:
        return encode_prompt(
            prompt,
            self.tokenizer_for(adapter),
            self.vocab_size_of(adapter),
            special_tokens_in_content,
            self.model_name,
            self.renderer_for(adapter),
        )

    # ---------------------------------------------------------------- requests

    def queue(self, requests: Sequence[NewRequest]) -> list[RequestStream]:
        """Every request checked here first (adapter known, prompt within the model's length),
        then each sent to the deployment as its own streaming call."""
        if not self._running:
            raise EngineStopped("the deployment's engine client has been shut down")
        checked = [
            (request, self._registration(request.adapter), self._prompt_ids(request)) for request in requests
        ]
        return [self._send(request, registration, token_ids) for request, registration, token_ids in checked]

    def _prompt_ids(self, request: NewRequest) -> list[int]:
        token_ids = self.encode(request.prompt, adapter=request.adapter)
        if not token_ids:
            raise InvalidRequest("the prompt is empty", "prompt")
        if len(token_ids) >= self.config.max_model_len:
            raise InvalidRequest(
                f"the prompt has {len(token_ids)} tokens; max_model_len is {self.config.max_model_len}",
                "prompt",
            )
        return token_ids

    def _send(
        self, request: NewRequest, registration: Registration | None, token_ids: list[int]
    ) -> RequestStream:
        adapter = request.adapter
        request_id = request.request_id or f"req-{next(self._request_counter)}-{uuid.uuid4().hex[:8]}"
        stream = RequestStream(
            RequestOutput(request_id, adapter, token_ids, arrival_time=time.monotonic()), request.loop
        )
        ticket = (registration.path, registration.token) if registration is not None else None
        params = request.params or SamplingParams()
        with self._lock:
            if adapter is not None:
                self._in_flight[adapter] += 1
            self._pumps[request_id] = asyncio.run_coroutine_threadsafe(
                self._pump(stream, token_ids, adapter, ticket, params), self._loop
            )
        return stream

    def abort(self, request_id: str) -> None:
        with self._lock:
            pump = self._pumps.get(request_id)
        if pump is not None:
            pump.cancel()

    async def _pump(
        self,
        stream: RequestStream,
        token_ids: list[int],
        adapter: str | None,
        ticket: tuple[str, str] | None,
        params: SamplingParams,
    ) -> None:
        output = stream.output
        handle = self._handle.options(stream=True, multiplexed_model_id=adapter or "")
        call = handle.generate.remote(token_ids, adapter, ticket, params, output.request_id)
        assert isinstance(call, DeploymentResponseGenerator)  # a streaming handle's answer
        try:
            async for item in call:
                if isinstance(item, RequestTotals):
                    item.apply(output)
                    continue
                self._record(output, item, params)
                stream.push(item)
        except asyncio.CancelledError:
            call.cancel()
            self._record(output, TokenDelta(output.request_id, [], "", True, "abort"), params)
            stream.push(TokenDelta(output.request_id, [], "", True, "abort"))
        except Exception as error:  # the replica refused the request, or died during it
            stream.fail(f"{type(error).__name__}: {error}")
        finally:
            with self._lock:
                self._pumps.pop(output.request_id, None)
                if adapter is not None:
                    self._in_flight[adapter] -= 1

    @staticmethod
    def _record(output: RequestOutput, delta: TokenDelta, params: SamplingParams) -> None:
        """Keep the whole output up to date, as the engine's worker does for a local request."""
        if delta.token_ids and output.first_token_time is None:
            output.first_token_time = time.monotonic()
        output.token_ids.extend(delta.token_ids)
        output.text += delta.text
        if params.logprobs is not None:
            output.logprobs = [*(output.logprobs or []), *delta.logprobs]
        if delta.prompt_logprobs is not None:
            output.prompt_logprobs = delta.prompt_logprobs
        if delta.finished:
            output.finish_reason, output.error = delta.finish_reason, delta.error
            output.error_type = delta.error_type
            output.finish_time = time.monotonic()

    # ---------------------------------------------------------------- state

    @property
    def running(self) -> bool:
        return self._running

    def shutdown(self) -> None:
        """Abort what is in flight and stop the client's loop (the replicas keep running)."""
        self._running = False
        with self._lock:
            pumps = list(self._pumps.values())
        for pump in pumps:
            pump.cancel()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._template_sandbox.close()
