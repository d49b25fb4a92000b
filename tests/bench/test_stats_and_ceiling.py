"""Summaries of request timings, SLO attainment and the weight-bandwidth ceiling."""

from __future__ import annotations

import pytest
import torch

from multilora_studio.bench.ceiling import Ceiling, adapter_bytes, copy_bandwidth, step_weight_bytes
from multilora_studio.bench.stats import RequestResult, Slo, attainment, percentiles, summarize
from multilora_studio.bench.tiers import tier_stats
from multilora_studio.engine import EngineMetrics
from multilora_studio.engine.model.model_source import RANDOM_SHAPES
from multilora_studio.engine.model.model_spec import PROJECTIONS


def result(start: float, first: float, end: float, tokens: int, error: str | None = None) -> RequestResult:
    return RequestResult("a", 10, tokens, tokens, start, first, end, error)


def test_request_timings():
    done = result(1.0, 1.5, 3.5, 5)
    assert done.ok and done.ttft == pytest.approx(0.5) and done.tpot == pytest.approx(0.5)
    assert result(0, 1, 1, 1).tpot is None
    assert not result(0, 1, 2, 3, error="boom").ok


def test_summary_throughput_percentiles_and_slo():
    results = [result(0.0, 0.1 * (i + 1), 1.0 + 0.1 * i, 10) for i in range(10)]
    results.append(result(0.0, None, None, 0, error="adapter failed"))  # type: ignore[arg-type]
    summary = summarize(results, 0.0, Slo(ttft_s=0.55, tpot_s=0.2))
    assert summary["requests"] == 11 and summary["completed"] == 10 and summary["errors"] == 1
    assert summary["first_error"] == "adapter failed"
    assert summary["output_tokens"] == 100
    assert summary["duration_s"] == pytest.approx(1.9)
    assert summary["output_tok_s"] == pytest.approx(100 / 1.9)
    ttft = summary["ttft_ms"]
    assert ttft["p50"] == pytest.approx(550.0) and ttft["p50"] <= ttft["p90"] <= ttft["p99"] <= 1000.0
    # first 5 meet the TTFT target; every TPOT is 0.1 s, under 0.2 s; the failed one counts as missed
    assert summary["slo_attainment"] == {"ttft": 5 / 11, "tpot": 10 / 11, "both": 5 / 11}
    assert attainment(results, Slo()) == {"ttft": None, "tpot": None, "both": None}
    assert percentiles([]) == {"p50": None, "p90": None, "p99": None}


def test_ceiling_of_the_llama3_8b_shape():
    spec = RANDOM_SHAPES["llama3-8b"]
    # 8.03 B parameters less the 0.525 B embedding rows a decode step does not read, in bf16
    assert step_weight_bytes(spec, torch.bfloat16) == (spec.num_parameters() - 128256 * 4096) * 2
    assert step_weight_bytes(spec, torch.bfloat16) == pytest.approx(15.01e9, rel=1e-3)
    # rank 16 on all seven projections: 32 layers x 16 x 81920 (in + out summed) x 2 bytes
    assert adapter_bytes(spec, 16, PROJECTIONS, torch.bfloat16) == 83_886_080
    ceiling = Ceiling(15_000_000_000, 84_000_000, 4.5e12, "given")
    assert ceiling.tokens_per_second(32) == pytest.approx(32 * 300.0)
    assert ceiling.tokens_per_second(32, 32) < ceiling.tokens_per_second(32)
    assert Ceiling(1, 1, None, "unknown").tokens_per_second(32) is None
    tied = RANDOM_SHAPES["smollm2-135m"]  # tied head: the table is read once per step
    assert step_weight_bytes(tied, torch.float32) == tied.num_parameters() * 4


def test_host_copy_bandwidth_is_measured():
    assert 1e8 < copy_bandwidth(torch.device("cpu"), 16 << 20, iters=3) < 1e13


def metrics(**counters: int) -> EngineMetrics:
    fields = dict.fromkeys(EngineMetrics.__dataclass_fields__, 0) | {"slots": (), "cpu_adapters": ()}
    fields |= {"cold_load_p50_s": 0.1, "cold_load_p95_s": 0.2, "state": "idle", "device": "cpu"}
    return EngineMetrics(**(fields | counters))


def test_tier_rates_count_what_had_to_move():
    before = metrics(gpu_hits=10, gpu_misses=4, cpu_hits=6, cpu_misses=2)
    # 20 adapter requests: 5 slot uploads, 2 of them read from disk (each load is then a host hit)
    after = metrics(gpu_hits=30, gpu_misses=9, cpu_hits=11, cpu_misses=4, preemptions=1)
    stats = tier_stats(before, after, 20, torch.device("cpu"))
    assert stats["slot_uploads"] == 5 and stats["cold_loads"] == 2
    assert stats["gpu_hit_rate"] == pytest.approx(0.75)
    assert stats["cpu_hit_rate"] == pytest.approx(0.6)
    assert stats["engine_counters"] == {"gpu_hits": 20, "gpu_misses": 5, "cpu_hits": 5, "cpu_misses": 2}
    assert stats["cold_load_p95_ms"] == pytest.approx(200.0) and stats["preemptions"] == 1
    assert tier_stats(before, before, 0, torch.device("cpu"))["gpu_hit_rate"] is None


def test_phase_ms_per_step_splits_a_run_of_the_real_engine(tiny_model_dir):
    import time

    from benchmarks.engine_gpu import phase_ms_per_step
    from multilora_studio.engine import Engine, EngineConfig, SamplingParams
    from multilora_studio.engine.loop.diagnostics import step_profile

    config = EngineConfig(model=str(tiny_model_dir), device="cpu", dtype="float32", max_model_len=64)
    with Engine(config) as engine:
        engine.generate([[3, 4, 5]], [None], SamplingParams(max_tokens=2, temperature=0))
        before = step_profile(engine)
        start = time.perf_counter()
        engine.generate(
            [[3, 4, 5], [6, 7]], [None, None], SamplingParams(max_tokens=9, temperature=0, ignore_eos=True)
        )
        elapsed_ms = (time.perf_counter() - start) * 1e3
        after = step_profile(engine)
    per_step = phase_ms_per_step(before, after)
    steps = after["steps"] - before["steps"]
    assert steps >= 9  # one prefill step, then a decode step per new token
    assert set(per_step) >= {"schedule", "prepare", "launch", "sample", "postprocess"}
    assert all(v >= 0 for v in per_step.values())
    assert 0 < sum(per_step.values()) * steps <= elapsed_ms * 1.05
