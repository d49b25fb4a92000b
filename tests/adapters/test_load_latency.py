"""Load latencies of a tier: nearest-rank quantiles over the recent loads, overall and per adapter,
in bounded memory; an adapter's figures are its own and leave with it."""

from __future__ import annotations

import threading

import pytest

from multilora_studio.adapters.load_latency import (
    ADAPTER_WINDOW,
    LATENCY_WINDOW,
    NO_LOADS,
    AdapterLatencies,
    LoadQuantiles,
    TierCounters,
)


@pytest.mark.parametrize(
    ("samples", "q", "expected"),
    [
        ([3.0], 0.5, 3.0),
        ([3.0], 0.95, 3.0),
        ([2.0, 1.0], 0.5, 1.0),
        ([4.0, 1.0, 3.0, 2.0], 0.5, 2.0),
        ([4.0, 1.0, 3.0, 2.0], 0.75, 3.0),
        ([float(i) for i in range(1, 21)], 0.95, 19.0),
        ([float(i) for i in range(1, 21)], 0.5, 10.0),
        ([float(i) for i in range(1, 11)], 0.7, 7.0),
        ([float(i) for i in range(1, 101)], 0.95, 95.0),
        ([5.0, 1.0], 1.0, 5.0),
        ([5.0, 1.0], 0.0, 1.0),
    ],
)
def test_percentile_is_nearest_rank(samples, q, expected):
    counters = TierCounters(load_seconds=list(samples))
    assert counters.percentile(q) == expected


def test_percentile_without_loads_is_none():
    assert TierCounters().percentile(0.5) is None
    assert TierCounters().adapters.summaries() == {}


def test_load_latency_quantiles_are_of_the_recent_loads_only():
    counters = TierCounters()
    for _ in range(3 * LATENCY_WINDOW):
        counters.record("a", 10.0)  # old, slow loads
    for _ in range(LATENCY_WINDOW):
        counters.record("a", 0.001)
    assert len(counters.load_seconds) < 2 * LATENCY_WINDOW  # bounded memory
    assert counters.percentile(0.95) == 0.001  # the window holds only the recent loads


def test_each_adapter_has_its_own_counts_and_quantiles():
    counters = TierCounters()
    slow = [0.5, 0.1, 0.3, 0.2, 0.4]  # sorted: 0.1 0.2 0.3 0.4 0.5 -> p50 rank 3, p95 rank 5
    for seconds in slow:
        counters.record("slow", seconds)
    counters.record("fast", 0.01)
    counters.record("fast", 0.03)  # two loads: p50 is the first of the two, p95 the second
    assert counters.adapters.summaries() == {
        "slow": LoadQuantiles(5, 0.3, 0.5),
        "fast": LoadQuantiles(2, 0.01, 0.03),
    }
    assert counters.percentile(0.5) == 0.2  # overall: 7 loads, rank 4 of 0.01 0.03 0.1 0.2 ...


def test_an_adapters_quantiles_are_of_its_last_loads_and_its_memory_is_bounded():
    latencies = AdapterLatencies()
    for _ in range(5 * ADAPTER_WINDOW):
        latencies.record("a", 9.0)
    recent = [0.001 * (i + 1) for i in range(ADAPTER_WINDOW)]  # the window: 1 ms ... 32 ms
    for seconds in recent:
        latencies.record("a", seconds)
    (summary,) = latencies.summaries().values()
    assert summary.loads == 6 * ADAPTER_WINDOW  # every load counted, only the last ones kept
    assert summary.p50_s == recent[ADAPTER_WINDOW // 2 - 1] and summary.p95_s == recent[-2]
    assert len(latencies._seconds["a"]) < 2 * ADAPTER_WINDOW


def test_forgetting_an_adapter_drops_its_figures_and_each_change_is_named_once():
    latencies = AdapterLatencies()
    latencies.record("a", 0.2)
    latencies.record("b", 0.1)
    assert latencies.take_changed() == {"a", "b"} and latencies.take_changed() == set()
    assert set(latencies.summaries()) == {"a", "b"}
    latencies.forget("a")
    latencies.forget("never-loaded")  # nothing to drop: no change
    assert latencies.take_changed() == {"a"}
    assert latencies.summaries() == {"b": LoadQuantiles(1, 0.1, 0.1)}
    assert latencies.summary("a") == NO_LOADS
    latencies.record("a", 0.4)  # added again: counted afresh
    assert latencies.summary("a") == LoadQuantiles(1, 0.4, 0.4) and latencies.take_changed() == {"a"}


def test_loads_recorded_from_several_threads_are_all_counted():
    latencies = AdapterLatencies()

    def load(name: str) -> None:
        for i in range(500):
            latencies.record(name, i / 1000)
            if i % 50 == 0:
                latencies.summaries()  # a reader (the metrics publisher) meanwhile

    threads = [threading.Thread(target=load, args=(name,)) for name in ("a", "b", "a", "c")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    summaries = latencies.summaries()
    assert {name: s.loads for name, s in summaries.items()} == {"a": 1000, "b": 500, "c": 500}
    assert summaries["b"].p95_s == 0.498  # of b's last 32 loads, 0.468 ... 0.499: the 31st
