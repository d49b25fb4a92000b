"""Per-request timings and the summary of a case: throughput, latency percentiles, SLO attainment."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

PERCENTILES = (50, 90, 99)


@dataclass
class RequestResult:
    """What one request did; times in seconds on one monotonic clock."""

    adapter: str | None
    input_tokens: int
    expected_tokens: int
    output_tokens: int = 0
    start: float = 0.0
    first_token: float | None = None
    end: float | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.end is not None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first (None for one-token outputs)."""
        if self.first_token is None or self.end is None or self.output_tokens < 2:
            return None
        return (self.end - self.first_token) / (self.output_tokens - 1)


@dataclass(frozen=True)
class Slo:
    """Latency targets in seconds; None = not checked."""

    ttft_s: float | None = None
    tpot_s: float | None = None


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50/p90/p99 (linear interpolation), None when there are no values."""
    if not values:
        return {f"p{p}": None for p in PERCENTILES}
    points = np.percentile(np.asarray(values, dtype=np.float64), PERCENTILES)
    return {f"p{p}": float(v) for p, v in zip(PERCENTILES, points, strict=True)}


def attainment(results: Sequence[RequestResult], slo: Slo) -> dict[str, float | None]:
    """Fraction of all requests that finished and met each target (and both)."""
    if not results:
        return {"ttft": None, "tpot": None, "both": None}

    def meets_ttft(r: RequestResult) -> bool:
        return slo.ttft_s is None or (r.ttft is not None and r.ttft <= slo.ttft_s)

    def meets_tpot(r: RequestResult) -> bool:
        return slo.tpot_s is None or r.tpot is None or r.tpot <= slo.tpot_s

    done = [r for r in results if r.ok]
    count = len(results)
    return {
        "ttft": sum(map(meets_ttft, done)) / count if slo.ttft_s is not None else None,
        "tpot": sum(map(meets_tpot, done)) / count if slo.tpot_s is not None else None,
        "both": sum(meets_ttft(r) and meets_tpot(r) for r in done) / count
        if slo.ttft_s is not None or slo.tpot_s is not None
        else None,
    }


def summarize(results: Sequence[RequestResult], started: float, slo: Slo) -> dict:
    """Throughput over the span from ``started`` to the last finish, latency percentiles in ms."""
    done = [r for r in results if r.ok]
    finished = max((r.end for r in done if r.end is not None), default=started)
    span = finished - started
    output_tokens = sum(r.output_tokens for r in done)
    summary = {
        "requests": len(results),
        "completed": len(done),
        "errors": len(results) - len(done),
        "first_error": next((r.error for r in results if r.error), None),
        "input_tokens": sum(r.input_tokens for r in done),
        "output_tokens": output_tokens,
        "expected_output_tokens": sum(r.expected_tokens for r in results),
        "duration_s": span,
        "output_tok_s": output_tokens / span if span > 0 else None,
        "requests_s": len(done) / span if span > 0 else None,
        "ttft_ms": _ms(percentiles([r.ttft for r in done if r.ttft is not None])),
        "tpot_ms": _ms(percentiles([r.tpot for r in done if r.tpot is not None])),
        "slo_attainment": attainment(results, slo),
    }
    summary["decode_tok_s"] = decode_rate(done)
    return summary


def decode_rate(done: Sequence[RequestResult]) -> float | None:
    """Tokens after every request's first token, over that span (for requests started together)."""
    firsts = [r.first_token for r in done if r.first_token is not None]
    if not firsts or len(firsts) != len(done):
        return None
    last_first = max(firsts)
    finished = max(r.end for r in done if r.end is not None)
    span = finished - last_first
    tokens = sum(r.output_tokens - 1 for r in done)
    return tokens / span if span > 0 and tokens > 0 else None


def _ms(values: dict[str, float | None]) -> dict[str, float | None]:
    return {k: None if v is None or math.isnan(v) else v * 1e3 for k, v in values.items()}
