"""Bounded load test on loopback: 64 concurrent streaming clients over 8 adapters."""

from __future__ import annotations

import asyncio
import statistics
import time

import openai

from multilora_studio.engine import SamplingParams

CLIENTS = 64
MAX_TOKENS = 16


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


async def stream_one(api: openai.AsyncOpenAI, model: str, prompt: str) -> tuple[str, float, float, int]:
    """Text, latency, time to first token and chunk count of one streamed completion."""
    started = time.perf_counter()
    first = None
    parts = []
    stream = await api.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    async for chunk in stream:
        if first is None:
            first = time.perf_counter() - started
        parts.extend(choice.text for choice in chunk.choices)
    return "".join(parts), time.perf_counter() - started, first or 0.0, len(parts)


def test_64_streaming_clients_over_8_adapters(serve, engine, server_adapters, capsys):
    server = serve()
    adapters = sorted(server_adapters)
    assert len(adapters) == 8
    jobs = [(adapters[i % 8], f"Client {i} asks about topic {i * 7 % 13}") for i in range(CLIENTS)]

    async def run_all():
        api = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
        try:
            return await asyncio.gather(*(stream_one(api, model, prompt) for model, prompt in jobs))
        finally:
            await api.close()

    expected = engine.generate(  # the engine's own answers; this also warms it up for these batch shapes
        [prompt for _, prompt in jobs],
        [model for model, _ in jobs],
        SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True),
    )
    started = time.perf_counter()
    results = asyncio.run(run_all())
    wall = time.perf_counter() - started

    assert [text for text, *_ in results] == [output.text for output in expected]  # none lost or mixed up
    assert all(chunks >= 1 for *_, chunks in results)
    records = server.request_log.records()
    assert len(records) == CLIENTS and {r.status for r in records} == {200}
    assert all(r.completion_tokens == MAX_TOKENS for r in records)
    latency = [1000 * latency for _, latency, _, _ in results]
    ttft = [1000 * ttft for _, _, ttft, _ in results]
    with capsys.disabled():
        print(
            f"\nload: {CLIENTS} streaming clients, 8 adapters, {MAX_TOKENS} tokens each: "
            f"{CLIENTS / wall:.1f} requests/s, {CLIENTS * MAX_TOKENS / wall:.0f} tokens/s; "
            f"latency p50 {percentile(latency, 0.5):.0f} ms, p99 {percentile(latency, 0.99):.0f} ms; "
            f"TTFT p50 {statistics.median(ttft):.0f} ms, p99 {percentile(ttft, 0.99):.0f} ms"
        )
