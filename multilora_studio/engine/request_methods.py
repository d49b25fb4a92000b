"""Whole-request calls built on ``submit`` / ``submit_many`` / ``abort``: shared by an engine and
by a set of engine replicas behind one dispatcher."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterator, Sequence

from multilora_studio.engine.config import SamplingParams
from multilora_studio.engine.outputs import RequestOutput, TokenDelta
from multilora_studio.engine.prompts import Prompt
from multilora_studio.engine.requests import RequestStream


class RequestMethods(ABC):
    """``generate``, ``score``, ``stream`` and ``astream`` over the three primitives."""

    @abstractmethod
    def submit(
        self,
        prompt: Prompt,
        adapter: str | None = None,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> RequestStream:
        """Queue one request; returns its stream at once."""

    @abstractmethod
    def submit_many(
        self, requests: Sequence[tuple[Prompt, str | None, SamplingParams | None]]
    ) -> list[RequestStream]:
        """Queue several requests at once (validated first: one refused, none queued)."""

    @abstractmethod
    def abort(self, request_id: str) -> None:
        """Stop a request; it finishes with reason 'abort'."""

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
