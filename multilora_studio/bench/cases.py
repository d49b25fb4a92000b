"""What one ``bench`` run measures: its options and the list of cases they expand to."""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from multilora_studio.bench.latency import LATENCY_SIZES, LatencySizes
from multilora_studio.bench.stats import Slo
from multilora_studio.bench.workloads import (
    PATTERNS,
    BenchRequest,
    online_workload,
    pattern_pool_size,
    pattern_workload,
    prompt_token_ids,
)
from multilora_studio.engine.model.model_spec import PROJECTIONS


@dataclass
class BenchOptions:
    """Everything ``multilora-studio bench`` can be told (see docs/bench.md)."""

    model: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    rank: int = 16
    targets: tuple[str, ...] = PROJECTIONS
    num_adapters: int = 32
    distinct_weights: int = 8
    max_loras: int = 8
    max_cpu_loras: int | None = None
    load_workers: int | None = None
    adapter_loader: str = "auto"
    prefetch_host: bool = False
    sample_stacks: bool = False  # diagnostic: thread stacks of each case's slowest steps
    max_num_seqs: int | None = None
    kv_cache_gb: float | None = None
    batch: int = 8
    patterns: tuple[str, ...] = ()
    online: bool = False
    rates: tuple[float, ...] = ()
    cv: float = 1.0
    alpha: float = 1.0
    duration: float = 10.0
    input_len: tuple[int, int] = (64, 64)
    output_len: tuple[int, int] = (32, 32)
    sweep_adapters: tuple[int, ...] = ()
    sweep_rate: float = math.inf
    requests: tuple[int, ...] = ()  # requests of each inf-rate case; several: one sweep case each
    seed: int = 0
    slo: Slo = field(default_factory=Slo)
    baseline: str | None = None
    baseline_output_len: int | None = None
    baseline_patterns: tuple[str, ...] = ()
    bandwidth_gbps: float | None = None
    endpoint: str | None = None
    api_key: str | None = None
    adapter_dir: Path | None = None
    warmup: bool = True
    progress: bool = True
    latency: str | None = None  # "full", "small" or "auto" (small on the CPU): the ``bench latency`` case
    latency_rounds: int = 3

    def __post_init__(self) -> None:
        for name in ("rank", "num_adapters", "distinct_weights", "max_loras", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        unknown = [p for p in (*self.patterns, *self.baseline_patterns) if p not in PATTERNS]
        if unknown:
            raise ValueError(f"unknown pattern {unknown[0]!r}; known: {', '.join(PATTERNS)}, all")
        if self.online and not self.rates:
            raise ValueError("--online needs --rate (requests per second, e.g. --rate 2,8)")
        if any(not r > 0 for r in self.rates) or not self.sweep_rate > 0:
            raise ValueError("request rates must be > 0 (inf: all requests at once)")
        if any(n < 1 for n in self.sweep_adapters):
            raise ValueError("--sweep-adapters lists numbers of adapters >= 1")
        if self.latency not in (None, "auto", *LATENCY_SIZES):
            raise ValueError(f"--latency-sizes takes auto, {', '.join(LATENCY_SIZES)}; got {self.latency!r}")
        if self.latency and (self.endpoint or self.baseline):
            raise ValueError(
                "bench latency runs in-process without a baseline; leave out --endpoint / --baseline"
            )
        if self.latency_rounds < 1:
            raise ValueError(f"--rounds must be >= 1, got {self.latency_rounds}")
        if not self.patterns and not self.online and not self.sweep_adapters and not self.latency:
            self.patterns = PATTERNS
        if not self.requests:
            self.requests = (4 * self.batch,)
        if any(n < 1 for n in self.requests):
            raise ValueError("--requests lists numbers of requests >= 1")
        if self.baseline not in (None, "peft"):
            raise ValueError(f"--baseline knows only 'peft', got {self.baseline!r}")
        if self.baseline and self.endpoint:
            raise ValueError("--baseline runs in-process; leave out --endpoint")
        if self.baseline and not self.patterns:
            raise ValueError("--baseline compares the batch patterns; give --pattern too")
        if not self.baseline_patterns:
            self.baseline_patterns = self.patterns
        missing = [p for p in self.baseline_patterns if p not in self.patterns]
        if missing:
            raise ValueError(f"--baseline-patterns {', '.join(missing)} must also be in --pattern")

    @property
    def seqs(self) -> int:
        return self.max_num_seqs or self.batch

    def latency_sizes(self, device_type: str) -> LatencySizes | None:
        """The ``bench latency`` sizes on ``device_type`` (None: no latency case)."""
        if self.latency is None:
            return None
        name = ("small" if device_type == "cpu" else "full") if self.latency == "auto" else self.latency
        return LATENCY_SIZES[name]


@dataclass
class Case:
    """One measured workload: its requests and prompts, and what describes it in the report."""

    name: str
    kind: str  # "pattern", "online" or "sweep"
    requests: list[BenchRequest]
    prompts: list[list[int]]
    params: dict

    @property
    def pool_size(self) -> int:
        """Adapters the case may draw from (its indices are below this)."""
        return int(self.params.get("num_adapters", 0))

    @property
    def distinct_adapters(self) -> int:
        return len({r.adapter for r in self.requests if r.adapter is not None})


def case_rng(seed: int, name: str) -> np.random.Generator:
    """A generator per case, so adding or removing one case leaves the others' draws as they were."""
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def _case(name: str, kind: str, requests: list[BenchRequest], rng, params: dict, vocab: int) -> Case:
    prompts = [prompt_token_ids(r.input_len, rng, vocab) for r in requests]
    return Case(name, kind, requests, prompts, params)


def build_cases(options: BenchOptions, vocab_size: int = 10000) -> list[Case]:
    """The patterns, then the online rates, then the adapter-count sweep."""
    cases = []
    for pattern in options.patterns:
        name = f"{pattern} b={options.batch}"
        rng = case_rng(options.seed, name)
        requests = pattern_workload(pattern, options.batch, options.input_len, options.output_len, rng)
        params = {"pattern": pattern, "batch": options.batch}
        params["num_adapters"] = pattern_pool_size(pattern, options.batch)
        cases.append(_case(name, "pattern", requests, rng, params, vocab_size))
    for rate in options.rates if options.online else ():
        name = f"online n={options.num_adapters} rate={rate:g}"
        cases.append(_online_case(options, name, "online", options.num_adapters, rate, vocab_size))
    for count in options.sweep_adapters:
        for depth in options.requests:  # a queue-depth sweep when there are several
            name = f"sweep n={count}" + (f" requests={depth}" if len(options.requests) > 1 else "")
            rate = options.sweep_rate
            cases.append(_online_case(options, name, "sweep", count, rate, vocab_size, depth))
    return cases


def _online_case(
    options: BenchOptions, name: str, kind: str, count: int, rate: float, vocab: int, requests: int = 0
) -> Case:
    rng = case_rng(options.seed, name)
    workload = online_workload(
        count,
        options.alpha,
        rate,
        options.cv,
        options.duration,
        options.input_len,
        options.output_len,
        rng,
        num_requests=requests or options.requests[0],
    )
    if not workload:
        raise ValueError(f"{name}: no request arrives within {options.duration} s; raise --duration")
    params = {
        "num_adapters": count,
        "alpha": options.alpha,
        "rate": None if math.isinf(rate) else rate,
        "cv": None if math.isinf(rate) else options.cv,
        "arrival_window_s": None if math.isinf(rate) else options.duration,
    }
    return _case(name, kind, workload, rng, params, vocab)
