"""Workload generators: pattern adapter counts, Zipf skew, arrival statistics, length ranges."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from multilora_studio.bench.cases import BenchOptions, build_cases
from multilora_studio.bench.workloads import (
    TOKEN_HIGH,
    TOKEN_LOW,
    arrival_times,
    online_workload,
    parse_range,
    pattern_adapters,
    pattern_workload,
    prompt_token_ids,
    sample_lengths,
    zipf_weights,
)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


@pytest.mark.parametrize("batch", [1, 7, 16, 32, 33])
def test_pattern_adapter_counts(batch):
    distinct = pattern_adapters("distinct", batch, rng())
    assert sorted(distinct) == list(range(batch))
    uniform = Counter(pattern_adapters("uniform", batch, rng()))
    assert len(uniform) == max(1, round(math.sqrt(batch)))
    assert max(uniform.values()) - min(uniform.values()) <= 1  # equal shares
    assert pattern_adapters("identical", batch, rng()) == [0] * batch
    assert pattern_adapters("base", batch, rng()) == [None] * batch
    skewed = pattern_adapters("skewed", batch, rng())
    assert len(skewed) == batch and all(0 <= a < batch for a in skewed)


def test_skewed_pattern_concentrates_on_few_adapters():
    counts = [len(set(pattern_adapters("skewed", 32, rng(seed)))) for seed in range(200)]
    # Zipf(1.5) over 32 adapters: far fewer than 32 distinct adapters per batch, more than one
    assert 4 <= np.mean(counts) <= 12
    draws = Counter(a for seed in range(200) for a in pattern_adapters("skewed", 32, rng(seed)))
    weights = zipf_weights(32, 1.5)
    assert draws[0] / 6400 == pytest.approx(weights[0], abs=0.03)
    assert draws[0] > draws[1] > draws[3] > draws[15]


def test_zipf_weights():
    weights = zipf_weights(1000, 1.0)
    assert weights.sum() == pytest.approx(1.0)
    assert weights[0] / weights[9] == pytest.approx(10.0)
    assert np.all(np.diff(weights) < 0)
    assert np.allclose(zipf_weights(5, 0.0), 0.2)
    with pytest.raises(ValueError, match="alpha"):
        zipf_weights(5, -1)
    with pytest.raises(ValueError, match="adapters"):
        zipf_weights(0, 1)


@pytest.mark.parametrize("cv", [0.5, 1.0, 3.0])
def test_arrival_rate_and_burstiness(cv):
    times = arrival_times(rate=40.0, cv=cv, duration=500.0, rng=rng(7))
    gaps = np.diff([0.0, *times])
    assert len(times) / 500.0 == pytest.approx(40.0, rel=0.06)
    assert gaps.mean() == pytest.approx(1 / 40.0, rel=0.06)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)
    assert all(0 <= t < 500.0 for t in times) and times == sorted(times)


def test_arrivals_are_reproducible_and_checked():
    assert arrival_times(5, 1, 10, rng(3)) == arrival_times(5, 1, 10, rng(3))
    assert arrival_times(5, 1, 10, rng(3)) != arrival_times(5, 1, 10, rng(4))
    for bad in ({"rate": 0}, {"rate": math.inf}, {"cv": 0}, {"duration": -1}):
        args = {"rate": 5.0, "cv": 1.0, "duration": 10.0} | bad
        with pytest.raises(ValueError):
            arrival_times(rng=rng(), **args)


def test_length_ranges():
    lengths = sample_lengths((8, 12), 2000, rng())
    assert min(lengths) == 8 and max(lengths) == 12
    assert set(lengths) == set(range(8, 13))
    assert sample_lengths((5, 5), 3, rng()) == [5, 5, 5]
    assert parse_range("64") == (64, 64)
    assert parse_range("8:512") == (8, 512)
    for bad in ("0", "9:3", "a:b", "4:"):
        with pytest.raises(ValueError, match="range"):
            parse_range(bad)


def test_online_workload():
    requests = online_workload(200, 1.0, 20.0, 2.0, 60.0, (4, 9), (2, 5), rng(1))
    assert len(requests) == pytest.approx(1200, rel=0.15)
    assert all(4 <= r.input_len <= 9 and 2 <= r.output_len <= 5 for r in requests)
    assert all(0 <= r.adapter < 200 for r in requests)
    popular = Counter(r.adapter for r in requests)
    assert popular[0] > popular[9] > 0
    assert popular[0] / len(requests) == pytest.approx(zipf_weights(200, 1.0)[0], abs=0.03)
    closed = online_workload(8, 1.0, math.inf, 1.0, 1.0, (4, 4), (2, 2), rng(), num_requests=50)
    assert len(closed) == 50 and {r.arrival_s for r in closed} == {0.0}
    with pytest.raises(ValueError, match="number of requests"):
        online_workload(8, 1.0, math.inf, 1.0, 1.0, (4, 4), (2, 2), rng())


def test_pattern_workload_and_prompts():
    requests = pattern_workload("distinct", 6, (3, 3), (7, 7), rng())
    assert [r.arrival_s for r in requests] == [0.0] * 6
    assert {(r.input_len, r.output_len) for r in requests} == {(3, 7)}
    ids = prompt_token_ids(500, rng())
    assert len(ids) == 500 and min(ids) >= TOKEN_LOW and max(ids) < TOKEN_HIGH
    assert max(prompt_token_ids(200, rng(), vocab_size=150)) < 150


def test_cases_of_the_options():
    options = BenchOptions(
        batch=8,
        patterns=("distinct", "base"),
        online=True,
        rates=(2.0, 5.0),
        duration=4.0,
        sweep_adapters=(1, 64),
        requests=(10,),
    )
    cases = build_cases(options)
    assert [c.kind for c in cases] == ["pattern", "pattern", "online", "online", "sweep", "sweep"]
    assert [c.pool_size for c in cases] == [8, 0, 32, 32, 1, 64]
    assert [len(c.requests) for c in cases][-2:] == [10, 10]
    assert all(len(p) == r.input_len for c in cases for p, r in zip(c.prompts, c.requests, strict=True))
    depths = build_cases(BenchOptions(sweep_adapters=(1, 1000), requests=(16, 64)))
    assert [(c.name, len(c.requests)) for c in depths] == [
        ("sweep n=1 requests=16", 16),
        ("sweep n=1 requests=64", 64),
        ("sweep n=1000 requests=16", 16),
        ("sweep n=1000 requests=64", 64),
    ]
    with pytest.raises(ValueError, match="--requests"):
        BenchOptions(sweep_adapters=(1,), requests=(0,))
    again = build_cases(BenchOptions(batch=8, patterns=("base",)))
    assert again[0].prompts == cases[1].prompts  # a case's draws do not depend on the other cases
    assert BenchOptions().patterns == ("distinct", "uniform", "skewed", "identical", "base")
    with pytest.raises(ValueError, match="--rate"):
        BenchOptions(online=True)
    with pytest.raises(ValueError, match="unknown pattern"):
        BenchOptions(patterns=("zipf",))
