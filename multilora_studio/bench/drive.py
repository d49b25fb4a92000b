"""Send a workload's requests at their arrival times through a backend and collect the results."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Protocol

from tqdm import tqdm

from multilora_studio.bench.stats import RequestResult
from multilora_studio.bench.workloads import BenchRequest


class Backend(Protocol):
    """Runs one request to its end; errors are reported in the result, never raised."""

    async def send(self, prompt: list[int], adapter: str | None, output_len: int) -> RequestResult: ...


async def run_requests(
    backend: Backend,
    requests: Sequence[BenchRequest],
    prompts: Sequence[list[int]],
    names: Sequence[str | None],
    progress: tqdm | None = None,
) -> tuple[list[RequestResult], float]:
    """Send request i at ``started + arrival_s`` with ``prompts[i]`` to adapter ``names[i]``.

    Returns the results in request order and the monotonic start time.
    """
    started = time.monotonic()

    async def one(request: BenchRequest, prompt: list[int], name: str | None) -> RequestResult:
        delay = started + request.arrival_s - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        result = await backend.send(prompt, name, request.output_len)
        if progress is not None:
            progress.update(1)
        return result

    results = await asyncio.gather(*(one(r, p, n) for r, p, n in zip(requests, prompts, names, strict=True)))
    return list(results), started
