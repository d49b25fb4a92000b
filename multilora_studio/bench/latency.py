"""``bench latency``: what one person at the window feels, each figure with and without adapters.

Four measurements, each side by side in one engine (the cases alternate for ``rounds`` rounds
and the medians are reported):

* single stream: decode tok/s of one request, base and with one adapter;
* TTFT of one long prompt, base and with one adapter (one output token);
* prefill: many prompts submitted at once, prompt tokens per second until the last first
  token, base and with a few distinct adapters;
* batch end to end: a batch of short prompts, generated tokens per second from submission to
  the last token (prefill included), base, one adapter per row (all distinct) and one adapter
  for every row.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from multilora_studio.bench.workloads import prompt_token_ids
from multilora_studio.engine import Engine, SamplingParams


@dataclass(frozen=True)
class LatencySizes:
    """Prompt lengths, token counts and batch sizes of the four measurements."""

    stream_prompt: int = 128
    stream_tokens: int = 128
    ttft_prompt: int = 2048
    prefill_prompts: int = 16
    prefill_len: int = 1024
    prefill_adapters: int = 4
    batch: int = 32
    batch_prompt: int = 128
    batch_tokens: int = 64

    @property
    def adapters(self) -> int:
        """Distinct adapters the measurements use."""
        return max(self.batch, self.prefill_adapters)

    @property
    def longest(self) -> int:
        """The longest prompt plus its output."""
        return max(
            self.stream_prompt + self.stream_tokens,
            self.ttft_prompt + 1,
            self.prefill_len + 1,
            self.batch_prompt + self.batch_tokens,
        )


# "full": the figures on a GPU (an 8B shape); "small": the same measurements at sizes a
# CPU runs in a minute or two
LATENCY_SIZES = {
    "full": LatencySizes(),
    "small": LatencySizes(
        stream_prompt=32,
        stream_tokens=32,
        ttft_prompt=256,
        prefill_prompts=4,
        prefill_len=128,
        prefill_adapters=4,
        batch=8,
        batch_prompt=32,
        batch_tokens=16,
    ),
}


def _greedy(tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)


def single_stream(engine: Engine, prompt: list[int], adapter: str | None, tokens: int) -> float:
    """Decode tok/s of one request (after its first token)."""
    out = engine.generate([prompt], [adapter], _greedy(tokens))[0]
    assert out.first_token_time is not None and out.finish_time is not None
    return (len(out.token_ids) - 1) / max(out.finish_time - out.first_token_time, 1e-9)


def time_to_first_token(engine: Engine, prompt: list[int], adapter: str | None) -> float:
    """Seconds from submission to the first token of one prompt."""
    started = time.perf_counter()
    out = engine.generate([prompt], [adapter], _greedy(1))[0]
    assert out.first_token_time is not None
    return out.first_token_time - started


def prefill_rate(engine: Engine, prompts: list[list[int]], adapters: Sequence[str | None]) -> float:
    """Prompt tokens per second from submitting ``prompts`` at once to the last first token."""
    started = time.perf_counter()
    outs = engine.generate(prompts, list(adapters), _greedy(1))
    last = max(o.first_token_time or time.perf_counter() for o in outs)
    return sum(len(p) for p in prompts) / max(last - started, 1e-9)


def batch_end_to_end(
    engine: Engine, prompts: list[list[int]], adapters: Sequence[str | None], tokens: int
) -> float:
    """Generated tokens per second from submitting the batch to its last token (prefill included)."""
    started = time.perf_counter()
    outs = engine.generate(prompts, list(adapters), _greedy(tokens))
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - started)


def run_latency(
    engine: Engine, names: Sequence[str], sizes: LatencySizes, rounds: int, rng: np.random.Generator
) -> dict[str, Any]:
    """The four measurements over adapters ``names`` (at least ``sizes.adapters``); a JSON-ready dict."""
    if len(names) < sizes.adapters:
        raise ValueError(f"bench latency needs {sizes.adapters} adapters, got {len(names)}")
    vocab = engine.spec.vocab_size
    stream = prompt_token_ids(sizes.stream_prompt, rng, vocab)
    long_prompt = prompt_token_ids(sizes.ttft_prompt, rng, vocab)
    prefill = [prompt_token_ids(sizes.prefill_len, rng, vocab) for _ in range(sizes.prefill_prompts)]
    batch = [prompt_token_ids(sizes.batch_prompt, rng, vocab) for _ in range(sizes.batch)]
    first = names[0]
    prefill_names = [names[i % sizes.prefill_adapters] for i in range(sizes.prefill_prompts)]
    cases: dict[str, Callable[[], float]] = {
        "single stream, base": lambda: single_stream(engine, stream, None, sizes.stream_tokens),
        "single stream, one adapter": lambda: single_stream(engine, stream, first, sizes.stream_tokens),
        "TTFT, base": lambda: time_to_first_token(engine, long_prompt, None),
        "TTFT, one adapter": lambda: time_to_first_token(engine, long_prompt, first),
        "prefill, base": lambda: prefill_rate(engine, prefill, [None] * len(prefill)),
        "prefill, distinct adapters": lambda: prefill_rate(engine, prefill, prefill_names),
        "batch, base": lambda: batch_end_to_end(engine, batch, [None] * len(batch), sizes.batch_tokens),
        "batch, distinct adapters": lambda: batch_end_to_end(
            engine, batch, list(names[: sizes.batch]), sizes.batch_tokens
        ),
        "batch, one adapter": lambda: batch_end_to_end(
            engine, batch, [first] * len(batch), sizes.batch_tokens
        ),
    }
    for measure in cases.values():  # warm-up: slots filled, kernels compiled, graphs captured
        measure()
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, measure in cases.items():
            samples[name].append(measure())
    median = {name: statistics.median(values) for name, values in samples.items()}
    ratios = {
        "single stream: one adapter / base": median["single stream, one adapter"]
        / median["single stream, base"],
        "TTFT: one adapter / base": median["TTFT, one adapter"] / median["TTFT, base"],
        "prefill: distinct adapters / base": median["prefill, distinct adapters"] / median["prefill, base"],
        "batch: distinct adapters / base": median["batch, distinct adapters"] / median["batch, base"],
        "batch: one adapter / base": median["batch, one adapter"] / median["batch, base"],
    }
    return {"sizes": asdict(sizes), "rounds": rounds, "median": median, "samples": samples, "ratios": ratios}


UNITS = {"single stream": "tok/s", "TTFT": "ms", "prefill": "prompt tok/s", "batch": "tok/s"}


def render_latency(latency: dict[str, Any]) -> list[str]:
    """The latency figures and their ratios as report lines."""
    sizes = latency["sizes"]
    lines = [
        f"latency (medians of {latency['rounds']} rounds): single stream {sizes['stream_prompt']}-token "
        f"prompt, {sizes['stream_tokens']} tokens; TTFT of a {sizes['ttft_prompt']}-token prompt; prefill "
        f"{sizes['prefill_prompts']} x {sizes['prefill_len']} tokens over {sizes['prefill_adapters']} "
        f"adapters; batch {sizes['batch']} x {sizes['batch_prompt']}-token prompts, "
        f"{sizes['batch_tokens']} tokens, end to end"
    ]
    for name, value in latency["median"].items():
        unit = UNITS[name.split(",")[0]]
        shown = f"{1e3 * value:.1f}" if unit == "ms" else f"{value:.1f}"
        lines.append(f"  {name:<30} {shown:>10} {unit}")
    for name, ratio in latency["ratios"].items():
        lines.append(f"  {name:<36} {ratio:.3f}")
    return lines
