"""One HTTP generation request: its engine requests, their merged deltas, and its bookkeeping.

A Job holds an admission reservation and a lease on its base's engine from creation until
``close()``, which aborts whatever is unfinished in the engine (so its KV blocks are freed),
releases the lease (the base may be swapped out once no job holds it), charges the tokens to
the caller's key, and records metrics and the request log entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterator, Sequence
from dataclasses import dataclass, field

from starlette.types import Receive

from multilora_studio.engine import (
    EngineStopped,
    GrammarFailure,
    InvalidRequest,
    Prompt,
    RequestStream,
    SamplingParams,
    ServingEngine,
    TokenDelta,
    TokenLogprob,
    UnknownAdapter,
)
from multilora_studio.engine.outputs import ADAPTER_TIERS
from multilora_studio.engine.text.template_sandbox import TemplateBusy
from multilora_studio.server.context_window import check_fits
from multilora_studio.server.errors import ApiError
from multilora_studio.server.logprob_shapes import ScoreOptions
from multilora_studio.server.prompt_errors import prompt_error
from multilora_studio.server.request_log import RequestRecord
from multilora_studio.server.state import ModelTarget, ServerState
from multilora_studio.server.structured import structure_field
from multilora_studio.server.token_text import TokenText
from multilora_studio.server.usage import UNKNOWN_MODEL

log = logging.getLogger(__name__)

CLIENT_GONE = 499
ID_PREFIXES = {"chat": "chatcmpl-", "responses": "resp_"}  # other routes: "cmpl-"
PROMPT_FIELDS = {"chat": "messages", "responses": "input"}  # other routes: "prompt"
ENGINE_FIELD_PARAMS = {"bad_words_token_ids": "bad_words"}  # the engine's fields the request names otherwise


@dataclass
class Choice:
    """One engine request: choice ``index`` of the response (``prompt_index * n + i``)."""

    index: int
    prompt: Prompt
    params: SamplingParams
    counts_prompt: bool  # the first choice of its prompt carries the prompt's tokens in usage
    stream: RequestStream | None = None
    parts: list[str] = field(default_factory=list)
    tokens: int = 0
    finish_reason: str | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per generated token, when asked
    prompt_logprobs: Sequence[TokenLogprob | None] | None = None

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.stream.output.prompt_token_ids if self.stream is not None else []

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def cached_tokens(self) -> int:
        """Its prompt tokens whose KV came from the engine's prefix cache."""
        return self.stream.output.num_cached_tokens if self.stream is not None else 0


class Job:
    """The engine requests behind one HTTP request; see the module docstring."""

    def __init__(
        self,
        state: ServerState,
        route: str,
        model: str,
        target: ModelTarget,
        engine: ServingEngine,
        key: str,
        stream: bool,
        prompts: Sequence[Prompt],
        params: Sequence[SamplingParams],
        options: ScoreOptions | None = None,
        max_tokens_param: str | None = None,
    ) -> None:
        _check_sequences(state, route, len(prompts), len(params))
        sequences = len(prompts) * len(params)
        capped = max_tokens_param is not None  # None: each choice may run to the end of the context
        wanted = len(prompts) * sum(p.max_tokens for p in params) if capped else 0
        self.reserved = state.admission.acquire(key, sequences, wanted, max_tokens_param)
        self.state = state
        self.route = route
        self.model = model
        self.label = state.served_label(model)  # its metrics series' label
        self.target = target
        self.engine = engine  # leased from the pool: released by close()
        self.adapter = target.adapter
        self.key = key
        self.stream = stream
        self.options = options or ScoreOptions()
        self.max_tokens_param = max_tokens_param  # the field that set max_tokens; None: the default
        self.id = f"{ID_PREFIXES.get(route, 'cmpl-')}{uuid.uuid4().hex}"
        self.tool_format: str | None = None  # the call format answers are parsed in (chat with tools)
        self.created = int(time.time())
        self.arrival = time.time()
        self.started = time.perf_counter()
        self.choices = [
            Choice(p * len(params) + i, prompt, sample, i == 0)
            for p, prompt in enumerate(prompts)
            for i, sample in enumerate(params)
        ]
        self.error: ApiError | None = None
        self.closed = False
        self._aborted = False
        self._queue: asyncio.Queue[tuple[Choice, TokenDelta]] = asyncio.Queue()
        self._pumps: list[asyncio.Task] = []
        state.jobs.add(self)
        state.metrics.in_flight.inc(sequences)

    # ------------------------------------------------------------ engine side

    async def submit(self) -> None:
        """Tokenize every prompt, reserve its tokens, and queue every choice (tokenizing and
        queueing off the event loop); engine ValueErrors become 400s, an exhausted budget a 429."""
        loop = asyncio.get_running_loop()
        prompt_ids = await asyncio.shield(loop.run_in_executor(None, self._encode_all))
        self._reserve_prompts(prompt_ids)
        await asyncio.shield(loop.run_in_executor(None, self._submit_all, loop, prompt_ids))
        for choice in self.choices:
            assert choice.stream is not None
            self._pumps.append(asyncio.create_task(self._pump(choice, choice.stream)))

    def _request_param(self, field: str) -> str:
        """The request's parameter for the engine's ``InvalidRequest.field``: the output
        constraint by the field it came in, the prompt by the route's name for it, the
        server's ``bad_words`` for the token ids it becomes, any other by its own name."""
        structured = self.choices[0].params.structured if self.choices else None
        if field == "structured" and structured is not None:
            return structure_field(structured)
        if field == "prompt":
            return PROMPT_FIELDS.get(self.route, "prompt")
        return ENGINE_FIELD_PARAMS.get(field, field)

    def _encode_all(self) -> list[list[int]]:
        """Token ids of each choice's prompt (each prompt tokenized once)."""
        engine, specials = self.engine, self.state.config.allow_special_tokens_in_content
        encoded: list[list[int]] = []
        for choice in self.choices:
            if self._aborted:
                break
            if choice.counts_prompt:
                with self._engine_errors():
                    ids = engine.encode(choice.prompt, specials, self.adapter)
            encoded.append(ids)
        return encoded

    def _reserve_prompts(self, prompt_ids: list[list[int]]) -> None:
        """Reserve the prompts' tokens on the caller's budget (on the event loop). Choices without a
        cap get the budget that is left, shared out, as their cap (never more than the context)."""
        admission, param = self.state.admission, PROMPT_FIELDS.get(self.route, "prompt")
        prompt_tokens = sum(
            len(ids) for ids, c in zip(prompt_ids, self.choices, strict=False) if c.counts_prompt
        )
        room = admission.room(self.key)
        if self.max_tokens_param is None and room is not None:
            max_len = self.engine.config.max_model_len
            share = (room - prompt_tokens) // len(self.choices)
            caps = [max(1, min(share, max_len - len(ids))) for ids in prompt_ids]
            self.reserved += admission.reserve(self.key, self.reserved, prompt_tokens + sum(caps), param)
            for choice, cap in zip(self.choices, caps, strict=False):
                choice.params = dataclasses.replace(
                    choice.params, max_tokens=min(cap, choice.params.max_tokens)
                )
            return
        self.reserved += admission.reserve(self.key, self.reserved, prompt_tokens, param)

    @contextlib.contextmanager
    def _engine_errors(self) -> Iterator[None]:
        """Engine errors as API errors: ValueError 400 (404 for an adapter removed meanwhile), a busy
        template renderer 503 (``prompt_error``)."""
        engine = self.engine
        try:
            yield
        except ApiError:
            raise
        except TemplateBusy as error:
            raise prompt_error(error, PROMPT_FIELDS.get(self.route, "prompt")) from None
        except ValueError as error:
            if isinstance(error, UnknownAdapter) or (
                self.adapter is not None and not engine.has_adapter(self.adapter)
            ):  # removed since the request was routed to it
                raise ApiError(
                    404, f"The model `{self.model}` does not exist.", "model_not_found", "model"
                ) from None
            field = error.field if isinstance(error, InvalidRequest) else "prompt"
            raise ApiError(400, str(error), "invalid_value", self._request_param(field)) from None
        except RuntimeError as error:
            if isinstance(error, EngineStopped) or not engine.running:  # stopped, or its worker died
                raise ApiError(503, f"the engine is not running: {error}", "engine_unavailable") from None
            raise ApiError(500, f"the prompt could not be prepared: {error}", "engine_error") from None
        except Exception as error:  # the chat template can refuse a conversation (jinja errors)
            raise prompt_error(error, PROMPT_FIELDS.get(self.route, "prompt")) from None

    def _submit_all(self, loop: asyncio.AbstractEventLoop, prompt_ids: list[list[int]]) -> None:
        engine = self.engine
        for choice, token_ids in zip(self.choices, prompt_ids, strict=False):
            if self._aborted:
                return
            with self._engine_errors():
                check_fits(
                    len(token_ids),
                    choice.params.max_tokens,
                    engine.config.max_model_len,
                    self.max_tokens_param,
                )
                choice.stream = engine.submit(
                    token_ids, self.adapter, choice.params, f"{self.id}-{choice.index}", loop
                )
            if self._aborted:  # close() ran meanwhile on the loop: it may have missed this stream
                self._abort_engine_request(choice.stream.request_id)

    async def _pump(self, choice: Choice, stream: RequestStream) -> None:
        async for delta in stream:
            self._queue.put_nowait((choice, delta))

    def abort(self) -> None:
        """Abort every unfinished engine request of this job (idempotent)."""
        self._aborted = True
        for choice in self.choices:
            if choice.stream is not None and choice.finish_reason is None:
                self._abort_engine_request(choice.stream.request_id)

    def _abort_engine_request(self, request_id: str) -> None:
        with contextlib.suppress(RuntimeError):  # an engine already shut down has nothing left to free
            self.engine.abort(request_id)

    # ------------------------------------------------------------ client side

    async def deltas(self) -> AsyncIterator[tuple[Choice, TokenDelta]]:
        """Deltas of all choices as they come, with each choice's text, tokens and timing updated."""
        metrics = self.state.metrics
        remaining = sum(choice.finish_reason is None for choice in self.choices)
        while remaining:
            choice, delta = await self._queue.get()
            now = time.perf_counter()
            if delta.token_ids:
                if choice.first_token_at is None:
                    choice.first_token_at = now
                    metrics.ttft.labels(self.label).observe(now - self.started)
                elif choice.last_token_at is not None:
                    gap = (now - choice.last_token_at) / len(delta.token_ids)
                    for _ in delta.token_ids:
                        metrics.inter_token.labels(self.label).observe(gap)
                choice.last_token_at = now
                choice.tokens += len(delta.token_ids)
            choice.logprobs.extend(delta.logprobs)
            if delta.prompt_logprobs is not None:
                choice.prompt_logprobs = delta.prompt_logprobs
            choice.parts.append(delta.text)
            if delta.finished:
                remaining -= 1
                choice.finish_reason = delta.finish_reason or "stop"
                if self.error is None and choice.finish_reason in ("error", "abort"):
                    message = self._without_paths(delta.error)
                    self.error = _finish_error(choice.finish_reason, message, delta.error_type)
            yield choice, delta

    def _without_paths(self, message: str | None) -> str | None:
        """An engine error with the adapter's server folder written as its name (key holders read it)."""
        if message is None or self.adapter is None:
            return message
        for info in self.engine.list_adapters():
            if info.name == self.adapter:
                return message.replace(str(info.path), f"<adapter {info.name}>")
        return message

    async def run_to_end(self, receive: Receive) -> bool:
        """Consume every delta; False when the client disconnected first."""

        async def consume() -> None:
            async for _ in self.deltas():
                pass

        return await until_disconnect(consume(), receive)

    # ------------------------------------------------------------ bookkeeping

    @property
    def token_text(self) -> TokenText:
        """Token texts of this job's tokenizer (its adapter's own, or its base's)."""
        return self.state.token_text_for(self.engine, self.adapter)

    @property
    def prompt_tokens(self) -> int:
        return sum(choice.prompt_tokens for choice in self.choices if choice.counts_prompt)

    @property
    def cached_tokens(self) -> int:
        """Of ``prompt_tokens``, those whose KV came from the prefix cache."""
        return sum(choice.cached_tokens for choice in self.choices if choice.counts_prompt)

    @property
    def completion_tokens(self) -> int:
        return sum(choice.tokens for choice in self.choices)

    @property
    def ttft(self) -> float | None:
        firsts = [c.first_token_at for c in self.choices if c.first_token_at is not None]
        return min(firsts) - self.started if firsts else None

    def close(self, status: int | None = None, client_gone: bool = False) -> None:
        """Free everything this job holds and record how it ended (idempotent)."""
        if self.closed:
            return
        self.closed = True
        self.abort()
        for pump in self._pumps:
            pump.cancel()
        self.state.release(self.target)
        if client_gone:
            status = CLIENT_GONE
        elif status is None:
            status = self.error.status if self.error is not None else 200
        state, sequences = self.state, len(self.choices)
        prompt_tokens, completion_tokens = self.prompt_tokens, self.completion_tokens
        state.admission.release(self.key, sequences, self.reserved, prompt_tokens + completion_tokens)
        state.jobs.discard(self)
        latency = time.perf_counter() - self.started
        metrics = state.metrics
        metrics.in_flight.dec(sequences)
        metrics.requests.labels(self.label, str(status)).inc()
        metrics.prompt_tokens.labels(self.label).inc(prompt_tokens)
        metrics.generation_tokens.labels(self.label).inc(completion_tokens)
        if status == 200:
            metrics.latency.labels(self.label).observe(latency)
            metrics.tenant_latency.labels(self.key).observe(latency)
            if self.ttft is not None:
                metrics.tenant_ttft.labels(self.key).observe(self.ttft)
        error = None if status in (200, CLIENT_GONE) else (self.error.message if self.error else None)
        outputs = [choice.stream.output for choice in self.choices if choice.stream is not None]
        tiers = [output.adapter_tier for output in outputs if output.adapter_tier is not None]
        queues = [output.queue_time for output in outputs if output.queue_time is not None]
        state.record(
            RequestRecord(
                self.arrival,
                self.id,
                self.route,
                self.model,
                self.adapter,
                self.key,
                status,
                self.stream,
                prompt_tokens,
                completion_tokens,
                latency,
                self.ttft,
                error,
                engine_seconds=sum(output.engine_seconds for output in outputs),
                adapter_tier=min(tiers, key=ADAPTER_TIERS.index) if tiers else None,
                queue_s=max(queues) if queues else None,
                cached_tokens=self.cached_tokens,
            )
        )


def _check_sequences(state: ServerState, route: str, prompts: int, n: int) -> None:
    """400 when prompts x n exceeds the per-request limit (or the in-flight bound, if lower)."""
    config = state.config
    limit, flag = config.max_sequences_per_request, "--max-sequences-per-request"
    if config.max_in_flight < limit:
        limit, flag = config.max_in_flight, "--max-in-flight"
    if prompts * n <= limit:
        return
    param = "n" if n > 1 else PROMPT_FIELDS.get(route, "prompt")
    raise ApiError(
        400,
        f"this request asks for {prompts * n} sequences ({prompts} prompt{'s' * (prompts != 1)} x n={n}); "
        f"the server allows at most {limit} per request ({flag}); send fewer prompts or a smaller n",
        "invalid_value",
        param,
    )


def _finish_error(reason: str, message: str | None, error_type: type[Exception] | None) -> ApiError:
    if reason == "abort":
        return ApiError(503, f"the request was aborted: {message or 'the server is stopping'}", "aborted")
    if error_type is not None and issubclass(error_type, GrammarFailure):
        # the request's grammar cannot be followed with this model's tokens: the request's problem
        return ApiError(400, message or "the output constraint failed", "invalid_value")
    return ApiError(500, message or "the engine failed to run this request", "engine_error")


async def until_disconnect(work: Awaitable[None], receive: Receive) -> bool:
    """Run ``work`` until it ends (True) or the client disconnects (False, ``work`` cancelled)."""

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if task.done() and not task.cancelled():
        task.result()
        return True
    return False


def record_rejection(
    state: ServerState, route: str, model: str, key: str, stream: bool, error: ApiError
) -> None:
    """Log a request refused before any engine work (unknown model, limits, bad options)."""
    label = state.served_label(model) if error.status != 404 else UNKNOWN_MODEL  # 404: hidden or unknown
    state.metrics.requests.labels(label, str(error.status)).inc()
    state.record(
        RequestRecord(
            time.time(),
            f"rejected-{uuid.uuid4().hex[:12]}",
            route,
            model,
            None,
            key,
            error.status,
            stream,
            0,
            0,
            0.0,
            None,
            error.message,
        )
    )
