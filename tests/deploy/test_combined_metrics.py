"""Several replicas' snapshots as one: counts summed, slots numbered on, the optional cold-load
quantiles taken from the replicas that have them (a replica that has loaded nothing yet has none),
overall and per adapter."""

from __future__ import annotations

import dataclasses

from multilora_studio.adapters.load_latency import LoadQuantiles
from multilora_studio.deploy.combined_metrics import combine_metrics
from multilora_studio.engine import EngineMetrics
from multilora_studio.engine.outputs import AdapterLoadTimes, SlotState


def snapshot(**given) -> EngineMetrics:
    values = dict.fromkeys(EngineMetrics.__dataclass_fields__, 0) | {"slots": (), "cpu_adapters": ()}
    values |= {"adapter_loads": ()}
    values |= {"state": "idle", "device": "cpu", "cold_load_p50_s": None, "cold_load_p95_s": None}
    values |= {"adapter_loader": "thread", "kernel_compile_s": 0.0, "tokens_per_second": 0.0}
    return EngineMetrics(**(values | given))


def test_replicas_with_and_without_cold_loads_combine():
    loaded = snapshot(
        state="running",
        steps=5,
        gpu_misses=2,
        tokens_per_second=10.5,
        cold_load_p50_s=0.02,
        cold_load_p95_s=0.09,
        upload_p50_s=0.002,
        upload_p95_s=0.004,
        slots=(SlotState(0, "a", False, 1), SlotState(1, None, False, 0)),
        cpu_adapters=("a",),
    )
    fresh = snapshot(
        steps=3, tokens_per_second=2.0, slots=(SlotState(0, "b", True, 0),), cpu_adapters=("b", "a")
    )
    for snaps in ([loaded, fresh], [fresh, loaded]):
        combined = combine_metrics(snaps)
        assert (combined.steps, combined.gpu_misses, combined.tokens_per_second) == (8, 2, 12.5)
        assert (combined.cold_load_p50_s, combined.cold_load_p95_s) == (0.02, 0.09)
        assert (combined.upload_p50_s, combined.upload_p95_s) == (0.002, 0.004)
        assert combined.state == "running" and combined.device == "cpu,cpu"
        assert [slot.slot for slot in combined.slots] == [0, 1, 2]
        assert sorted(combined.cpu_adapters) == ["a", "b"]
    neither = combine_metrics([fresh, dataclasses.replace(fresh, device="cuda:1")])
    assert neither.cold_load_p50_s is None and neither.cold_load_p95_s is None
    assert neither.device == "cpu,cuda:1" and neither.state == "idle"


def test_an_adapters_loads_on_several_replicas_add_up_with_the_slowest_quantiles():
    none = LoadQuantiles(0, None, None)
    first = snapshot(
        adapter_loads=(
            AdapterLoadTimes("a", LoadQuantiles(2, 0.02, 0.05), LoadQuantiles(3, 0.001, 0.004)),
            AdapterLoadTimes("b", none, LoadQuantiles(1, 0.002, 0.002)),
        )
    )
    second = snapshot(
        adapter_loads=(
            AdapterLoadTimes("a", LoadQuantiles(1, 0.03, 0.03), none),
            AdapterLoadTimes("c", LoadQuantiles(4, 0.01, 0.02), LoadQuantiles(4, 0.001, 0.001)),
        )
    )
    combined = combine_metrics([second, first])
    assert combined.adapter_loads == (
        AdapterLoadTimes("a", LoadQuantiles(3, 0.03, 0.05), LoadQuantiles(3, 0.001, 0.004)),
        AdapterLoadTimes("b", none, LoadQuantiles(1, 0.002, 0.002)),
        AdapterLoadTimes("c", LoadQuantiles(4, 0.01, 0.02), LoadQuantiles(4, 0.001, 0.001)),
    )
