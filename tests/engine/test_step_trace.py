"""The engine's step trace: one record per step, consistent with what the requests produced."""

from __future__ import annotations

import time

from multilora_studio.engine import SamplingParams
from multilora_studio.engine.step.step_trace import StepRecord, StepTrace, records_as_dicts, summarize


def test_trace_records_every_step_of_a_mixed_batch(tiny_engine, tiny_adapters, engine_device):
    engine = tiny_engine
    names = list(tiny_adapters)[:2]
    since = time.perf_counter()
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16]]
    adapters = [names[0], None, names[1]]
    outputs = engine.generate(prompts, adapters, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    until = time.perf_counter()
    records = engine.step_trace.snapshot(since=since)
    # every prompt token and every generated token but the last went through a step
    expected_tokens = sum(len(p) for p in prompts) + sum(len(o.token_ids) - 1 for o in outputs)
    assert sum(r.tokens for r in records) == expected_tokens
    assert sum(r.prompt_tokens for r in records) == sum(len(p) for p in prompts)
    assert all(r.lora_sequences <= r.sequences for r in records)
    assert max(r.lora_sequences for r in records) == 2
    assert [r.start for r in records] == sorted(r.start for r in records)
    assert all(r.total_s > 0 and r.gap_s >= 0 and r.schedule_s >= 0 for r in records)
    assert any(r.graph for r in records) == (engine_device == "cuda")  # CUDA graphs on a GPU only

    summary = summarize(records)
    graphed = [r for r in records if r.graph]
    assert summary["steps"] == len(records)
    assert summary["graph_steps"]["count"] == len(graphed)
    assert summary["eager_steps"]["count"] == len(records) - len(graphed)
    assert summary["eager_prompt_tokens"] == sum(r.prompt_tokens for r in records if not r.graph)
    assert 0 < summary["wall_s"] <= until - since  # within the run, however fast the machine
    assert summary["mean_lora_sequences"] > 0
    # a window that starts after the run holds nothing
    assert engine.step_trace.snapshot(since=time.perf_counter()) == []


def test_trace_is_a_ring_and_summaries_split_by_kind():
    trace = StepTrace(capacity=3)

    def step(start: float, graph: bool, sample_s: float) -> StepRecord:
        return StepRecord(start, 0.001, 0.0, 0.001, 0.001, sample_s, 0.001, 4, 4, 0, 2, graph, 0)

    for i in range(5):
        trace.record(step(float(i), graph=i % 2 == 0, sample_s=0.01 * (i + 1)))
    kept = trace.snapshot()
    assert [r.start for r in kept] == [2.0, 3.0, 4.0]
    summary = summarize(kept)
    assert summary["graph_steps"]["count"] == 2 and summary["eager_steps"]["count"] == 1
    assert abs(summary["eager_steps"]["p50_ms"] - (0.04 + 0.003) * 1e3) < 1e-6
    assert records_as_dicts(kept)[0]["start"] == 2.0
    assert summarize([]) == {"steps": 0}
