"""The published multi-LoRA workloads as plain functions (seeded numpy generators, no engine).

Punica's batch popularity patterns (distinct, uniform, skewed, identical) and S-LoRA's
online workload (power-law adapter popularity, Poisson/gamma arrivals, length ranges).
Adapters are indices into a pool (0 = most popular); ``None`` is the base model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

PATTERNS = ("distinct", "uniform", "skewed", "identical", "base")
SKEWED_ALPHA = 1.5
TOKEN_LOW, TOKEN_HIGH = 100, 10000  # prompt token ids: valid in any real vocabulary


@dataclass(frozen=True)
class BenchRequest:
    """One request of a workload: when it arrives (seconds from the start), for which adapter."""

    arrival_s: float
    adapter: int | None
    input_len: int
    output_len: int


def parse_range(text: str) -> tuple[int, int]:
    """``"64"`` -> (64, 64); ``"8:512"`` -> (8, 512); ValueError for anything else."""
    low, sep, high = str(text).partition(":")
    try:
        bounds = (int(low), int(high) if sep else int(low))
    except ValueError:
        raise ValueError(f"a length range looks like 64 or 8:512, got {text!r}") from None
    if bounds[0] < 1 or bounds[1] < bounds[0]:
        raise ValueError(f"a length range needs 1 <= low <= high, got {text!r}")
    return bounds


def zipf_weights(n: int, alpha: float) -> np.ndarray:
    """P(adapter k) proportional to (k + 1) ** -alpha for k in 0..n-1 (alpha=0: uniform)."""
    if n < 1:
        raise ValueError(f"the number of adapters must be >= 1, got {n}")
    if alpha < 0:
        raise ValueError(f"the popularity exponent alpha must be >= 0, got {alpha}")
    weights = np.arange(1, n + 1, dtype=np.float64) ** -alpha
    return weights / weights.sum()


def pattern_pool_size(pattern: str, batch: int) -> int:
    """How many adapters a pattern draws from at this batch size (0 for base)."""
    sizes = {
        "distinct": batch,
        "uniform": max(1, round(math.sqrt(batch))),
        "skewed": batch,
        "identical": 1,
        "base": 0,
    }
    if pattern not in sizes:
        raise ValueError(f"unknown pattern {pattern!r}; known: {', '.join(PATTERNS)}")
    return sizes[pattern]


def pattern_adapters(pattern: str, batch: int, rng: np.random.Generator) -> list[int | None]:
    """Adapter of each request of one batch, Punica's way.

    distinct: every request its own adapter; uniform: ~sqrt(batch) adapters with equal
    shares; skewed: Zipf(1.5) draws over ``batch`` adapters; identical: one adapter;
    base: no adapter.
    """
    if batch < 1:
        raise ValueError(f"the batch size must be >= 1, got {batch}")
    pool = pattern_pool_size(pattern, batch)
    if pattern == "base":
        return [None] * batch
    if pattern == "skewed":
        return [int(k) for k in rng.choice(pool, size=batch, p=zipf_weights(pool, SKEWED_ALPHA))]
    return [int(k) for k in rng.permutation([i % pool for i in range(batch)])]


def sample_lengths(bounds: tuple[int, int], count: int, rng: np.random.Generator) -> list[int]:
    """``count`` integers uniform in [low, high] (inclusive)."""
    low, high = bounds
    return [int(v) for v in rng.integers(low, high + 1, size=count)]


def arrival_times(rate: float, cv: float, duration: float, rng: np.random.Generator) -> list[float]:
    """Arrival instants in [0, duration) with mean ``rate`` per second and burstiness ``cv``.

    Gaps are gamma-distributed with shape 1/cv^2 (cv=1: a Poisson process; cv>1: bursty).
    """
    if not rate > 0 or math.isinf(rate):
        raise ValueError(f"the arrival rate must be a positive number of requests/s, got {rate}")
    if not cv > 0:
        raise ValueError(f"the coefficient of variation must be > 0, got {cv}")
    if not duration > 0:
        raise ValueError(f"the duration must be > 0 seconds, got {duration}")
    shape = 1.0 / (cv * cv)
    scale = 1.0 / (rate * shape)
    times: list[float] = []
    now = 0.0
    expected = int(rate * duration) + 1
    while True:
        gaps = rng.gamma(shape, scale, size=max(16, expected))
        for gap in gaps:
            now += float(gap)
            if now >= duration:
                return times
            times.append(now)


def online_workload(
    num_adapters: int,
    alpha: float,
    rate: float,
    cv: float,
    duration: float,
    input_len: tuple[int, int],
    output_len: tuple[int, int],
    rng: np.random.Generator,
    num_requests: int | None = None,
) -> list[BenchRequest]:
    """S-LoRA's synthetic workload: adapters by power-law popularity, gamma arrivals.

    ``rate=inf`` sends ``num_requests`` requests at time 0 (a closed, saturating run).
    """
    if math.isinf(rate):
        if not num_requests or num_requests < 1:
            raise ValueError("an infinite rate needs a number of requests")
        arrivals = [0.0] * num_requests
    else:
        arrivals = arrival_times(rate, cv, duration, rng)
    count = len(arrivals)
    adapters = rng.choice(num_adapters, size=count, p=zipf_weights(num_adapters, alpha))
    inputs = sample_lengths(input_len, count, rng)
    outputs = sample_lengths(output_len, count, rng)
    return [
        BenchRequest(t, int(a), i, o) for t, a, i, o in zip(arrivals, adapters, inputs, outputs, strict=True)
    ]


def pattern_workload(
    pattern: str,
    batch: int,
    input_len: tuple[int, int],
    output_len: tuple[int, int],
    rng: np.random.Generator,
) -> list[BenchRequest]:
    """One batch of ``batch`` requests arriving together, adapters by ``pattern``."""
    adapters = pattern_adapters(pattern, batch, rng)
    inputs = sample_lengths(input_len, batch, rng)
    outputs = sample_lengths(output_len, batch, rng)
    return [BenchRequest(0.0, a, i, o) for a, i, o in zip(adapters, inputs, outputs, strict=True)]


def prompt_token_ids(length: int, rng: np.random.Generator, vocab_size: int = TOKEN_HIGH) -> list[int]:
    """Random prompt ids in [TOKEN_LOW, min(vocab_size, TOKEN_HIGH))."""
    high = min(vocab_size, TOKEN_HIGH)
    low = min(TOKEN_LOW, high - 1)
    return [int(t) for t in rng.integers(low, high, size=length)]
