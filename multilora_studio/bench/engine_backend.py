"""The in-process backend: requests go straight to an ``Engine`` (no HTTP)."""

from __future__ import annotations

import asyncio

from multilora_studio.bench.stats import RequestResult
from multilora_studio.engine import Engine, SamplingParams


class EngineBackend:
    """Greedy requests of exactly ``output_len`` tokens; times are the engine's own (monotonic)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def send(self, prompt: list[int], adapter: str | None, output_len: int) -> RequestResult:
        result = RequestResult(adapter, len(prompt), output_len)
        params = SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)
        try:
            stream = self.engine.submit(prompt, adapter, params, loop=asyncio.get_running_loop())
        except ValueError as error:
            result.error = str(error)
            return result
        async for _ in stream:
            pass
        output = stream.output
        result.start = output.arrival_time
        result.first_token = output.first_token_time
        result.end = output.finish_time
        result.output_tokens = len(output.token_ids)
        if output.finish_reason not in ("length", "stop"):
            result.error = output.error or f"finished with reason {output.finish_reason!r}"
        return result
