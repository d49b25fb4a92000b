"""The request role of a serving engine: ``submit`` and ``submit_many`` written once over one
``queue`` each engine implements, and the whole-request calls built on them (``generate``,
``score``, ``stream``, ``astream``). An engine, a set of engine replicas behind one dispatcher
and a Ray deployment's client all serve requests through it."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from multilora_studio.engine.config import EngineConfig
from multilora_studio.engine.loop.requests import RequestStream
from multilora_studio.engine.model.model_spec import ModelSpec
from multilora_studio.engine.outputs import RequestOutput, TokenDelta
from multilora_studio.engine.sampling_params import SamplingParams
from multilora_studio.engine.text.chat_tokens import Render
from multilora_studio.engine.text.prompts import Prompt


@dataclass(frozen=True)
class NewRequest:
    """One request as a caller submits it (``params`` None: ``SamplingParams()``; ``request_id``
    None: one is made; ``loop``: the asyncio loop its stream is read on, if any)."""

    prompt: Prompt
    adapter: str | None = None
    params: SamplingParams | None = None
    request_id: str | None = None
    loop: asyncio.AbstractEventLoop | None = None


class RequestServing(ABC):
    """Requests in, tokens out, for the base and its adapters."""

    config: EngineConfig
    spec: ModelSpec
    tokenizer: Any
    model_name: str
    base_digest: str
    model_folder: Path | None  # the base's weights (None: random weights)
    device: torch.device  # a replica set's first replica's
    dtype: torch.dtype

    @property
    @abstractmethod
    def running(self) -> bool:
        """Whether requests are taken (False once shut down)."""

    @abstractmethod
    def encode(
        self, prompt: Any, special_tokens_in_content: bool = False, adapter: str | None = None
    ) -> list[int]:
        """A prompt (text, token ids or chat messages) as ``adapter``'s token ids."""

    @abstractmethod
    def tokenizer_for(self, adapter: str | None) -> Any:
        """The tokenizer (and chat template) of ``adapter``'s requests."""

    @abstractmethod
    def renderer_for(self, adapter: str | None) -> Render:
        """How ``adapter``'s chat template renders."""

    @abstractmethod
    def vocab_size_of(self, adapter: str | None) -> int:
        """The vocabulary ``adapter``'s requests sample from."""

    @abstractmethod
    def queue(self, requests: Sequence[NewRequest]) -> list[RequestStream]:
        """Validate every request, then queue them together (one batch); one refused
        (ValueError), none is queued. Returns their streams at once, in order."""

    @abstractmethod
    def abort(self, request_id: str) -> None:
        """Stop a request; it finishes with reason 'abort'."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop serving; requests in flight end with reason 'abort'."""

    def submit(
        self,
        prompt: Prompt,
        adapter: str | None = None,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> RequestStream:
        """Queue one request; returns its stream at once."""
        (stream,) = self.queue([NewRequest(prompt, adapter, params, request_id, loop)])
        return stream

    def submit_many(
        self, requests: Sequence[tuple[Prompt, str | None, SamplingParams | None]]
    ) -> list[RequestStream]:
        """Queue several (prompt, adapter, params) at once: they reach the scheduler together
        (one batch); validated first, so one refused (ValueError) means none is queued."""
        return self.queue([NewRequest(prompt, adapter, params) for prompt, adapter, params in requests])

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

    def score(
        self,
        prompts: Sequence[Prompt],
        adapter_names: Sequence[str | None] | None = None,
        top_k: int = 0,
        adapter_scales: Sequence[float] | None = None,
    ) -> list[RequestOutput]:
        """Log-probability of every prompt token given the ones before it, all prompts in one batch.

        Each output's ``prompt_logprobs`` has one entry per prompt token (None for the first) with
        ``top_k`` alternatives; nothing is generated (``token_ids`` and ``text`` stay empty).
        ``adapter_scales`` gives each prompt's adapter strength (``SamplingParams.adapter_scale``).
        """
        scales = list(adapter_scales) if adapter_scales is not None else [1.0] * len(prompts)
        params = [SamplingParams(max_tokens=0, prompt_logprobs=top_k, adapter_scale=s) for s in scales]
        return self.generate(prompts, adapter_names, params)

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
