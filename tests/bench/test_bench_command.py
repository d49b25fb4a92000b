"""``multilora-studio bench`` in-process on the tiny model: every workload kind, JSON, plots, PEFT."""

from __future__ import annotations

import json
import time

import pytest

from multilora_studio.bench.cases import BenchOptions
from multilora_studio.bench.latency import LATENCY_SIZES
from multilora_studio.bench.stats import Slo
from multilora_studio.bench.suite import run_bench
from multilora_studio.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def check_case(case: dict) -> None:
    """All requests complete with exactly their tokens; percentiles in order; times consistent."""
    assert case["errors"] == 0 and case["completed"] == case["requests"] > 0
    assert case["output_tokens"] == case["expected_output_tokens"]
    assert case["output_tok_s"] > 0 and case["requests_s"] > 0
    for metric in ("ttft_ms", "tpot_ms"):
        values = case[metric]
        assert 0 < values["p50"] <= values["p90"] <= values["p99"]
    assert case["ttft_ms"]["p99"] <= case["duration_s"] * 1e3
    assert len(case["ttft_samples_ms"]) == case["requests"]
    assert case["slo_attainment"]["both"] == 1.0  # 60 s TTFT target


def test_in_process_run_json_table_and_plots(capsys, tiny_model_dir, tmp_path):
    report_path, plots = tmp_path / "report.json", tmp_path / "plots"
    code = main(
        [
            "bench",
            "--model",
            str(tiny_model_dir),
            "--device",
            "cpu",
            "--rank",
            "4",
            "--targets",
            "q_proj,v_proj,down_proj",
            "--batch",
            "4",
            "--max-loras",
            "4",
            "--max-cpu-loras",
            "6",
            "--distinct-weights",
            "2",
            "--input-len",
            "5:9",
            "--output-len",
            "3:6",
            "--pattern",
            "all",
            "--online",
            "--rate",
            "40",
            "--duration",
            "0.3",
            "--num-adapters",
            "6",
            "--sweep-adapters",
            "1,12",
            "--requests",
            "8",
            "--ttft-slo-ms",
            "60000",
            "--bandwidth-gbps",
            "10",
            "--no-progress",
            "--json",
            str(report_path),
            "--plot",
            str(plots),
        ]
    )
    assert code == 0
    table = capsys.readouterr().out
    report = json.loads(report_path.read_text())
    cases = {c["name"]: c for c in report["cases"]}
    assert list(cases) == [
        "distinct b=4",
        "uniform b=4",
        "skewed b=4",
        "identical b=4",
        "base b=4",
        "online n=6 rate=40",
        "sweep n=1",
        "sweep n=12",
    ]
    for case in cases.values():
        check_case(case)
        assert case["name"] in table
    assert cases["distinct b=4"]["distinct_adapters"] == 4
    assert cases["uniform b=4"]["distinct_adapters"] == 2
    assert cases["identical b=4"]["distinct_adapters"] == 1
    assert cases["sweep n=1"]["distinct_adapters"] == 1
    # tiers: each batch pattern runs after an unmeasured request per adapter, on resident
    # adapters (4 slots hold the distinct batch's 4): no uploads and no loads are measured
    distinct = cases["distinct b=4"]["engine"]
    assert (distinct["slot_uploads"], distinct["cold_loads"], distinct["gpu_hit_rate"]) == (0, 0, 1.0)
    identical = cases["identical b=4"]["engine"]
    assert (identical["slot_uploads"], identical["cold_loads"], identical["gpu_hit_rate"]) == (0, 0, 1.0)
    base = cases["base b=4"]["engine"]
    assert base["adapter_requests"] == 0 and base["gpu_hit_rate"] is None
    sweep = cases["sweep n=12"]
    assert sweep["distinct_adapters"] > 4  # Zipf(1.0) over 12 adapters, seed 0
    # at most 4 adapters (the slots) can be resident from earlier cases: the rest is uploaded
    assert sweep["engine"]["slot_uploads"] >= sweep["distinct_adapters"] - 4
    assert sweep["engine"]["adapter_requests"] == 8
    for case in cases.values():
        if case["kind"] == "pattern":
            assert case["decode_tok_s"] > 0 and case["ceiling_tok_s"] > 0
        else:
            assert case["decode_tok_s"] is None
    online = cases["online n=6 rate=40"]
    assert (online["rate"], online["cv"], online["arrival_window_s"]) == (40, 1.0, 0.3)
    ceiling = report["ceiling"]
    assert ceiling["bandwidth_GBps"] == 10 and ceiling["bandwidth_source"] == "given"
    assert ceiling["base_tok_s"] > ceiling["distinct_tok_s"] > 0
    assert "weights per decode step" in table and "TTFT ms p50/p90/p99" in table
    written = sorted(p.name for p in plots.iterdir())
    assert written == ["throughput_vs_adapters.png", "ttft_cdf_online.png", "ttft_cdf_pattern.png"]
    for png in plots.iterdir():
        data = png.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000
    # a saved report prints the same table and draws the same charts without running again
    replots = tmp_path / "replots"
    assert main(["bench", "--from-json", str(report_path), "--plot", str(replots)]) == 0
    assert capsys.readouterr().out == table
    assert sorted(p.name for p in replots.iterdir()) == written
    # kernel compiles during a case (none on the CPU) are named under the table
    assert all(c["engine"]["kernel_compiles"] == 0 for c in cases.values() if "engine" in c)
    assert "kernel compiles" not in table
    report["cases"][0]["engine"].update(kernel_compiles=3, kernel_compile_s=1.5)
    stalled = tmp_path / "stalled.json"
    stalled.write_text(json.dumps(report))
    assert main(["bench", "--from-json", str(stalled)]) == 0
    assert "note: distinct b=4: 3 kernel compiles (1.5 s) stalled the batch" in capsys.readouterr().out


def test_peft_baseline_on_the_tiny_model(tiny_model_dir):
    options = BenchOptions(
        model=str(tiny_model_dir),
        device="cpu",
        rank=8,
        batch=3,
        max_loras=4,
        distinct_weights=3,
        patterns=("distinct", "identical", "base"),
        input_len=(4, 8),
        output_len=(5, 5),
        baseline="peft",
        baseline_patterns=("distinct", "base"),
        bandwidth_gbps=10,
        progress=False,
    )
    report = run_bench(options)
    baseline = {c["name"]: c for c in report["baseline"]["cases"]}
    assert list(baseline) == ["distinct b=3", "base b=3"]
    engine = {c["name"]: c for c in report["cases"]}
    for name, case in baseline.items():
        assert case["output_tokens"] == 3 * 5
        assert case["output_tok_s"] > 0
        assert case["engine_over_peft"] == pytest.approx(engine[name]["output_tok_s"] / case["output_tok_s"])


def test_prefetch_host_reads_the_popular_adapters_before_each_sweep_case(tiny_model_dir):
    def run(prefetch: bool) -> dict[str, dict]:
        options = BenchOptions(
            model=str(tiny_model_dir),
            device="cpu",
            rank=4,
            batch=4,
            max_loras=2,
            max_cpu_loras=5,
            distinct_weights=2,
            input_len=(4, 6),
            output_len=(2, 2),
            sweep_adapters=(3, 12),
            requests=(12,),
            prefetch_host=prefetch,
            slo=Slo(ttft_s=60.0),
            bandwidth_gbps=10,
            progress=False,
        )
        return {c["name"]: c for c in run_bench(options)["cases"]}

    cases, plain = run(True), run(False)
    small, large = cases["sweep n=3"], cases["sweep n=12"]
    for case in (small, large):
        check_case(case)
    assert (small["prefetched_to_host"], large["prefetched_to_host"]) == (3, 5)
    assert plain["sweep n=3"]["prefetched_to_host"] == 0
    assert small["engine"]["cold_loads"] == 0 < plain["sweep n=3"]["engine"]["cold_loads"]
    # the same requests (seeded) in both runs; with more adapters than the tier holds, the
    # look-ahead's reads and the evictions follow the timing, so the large case's disk reads
    # are not compared: a prefetched adapter pushed out by a cold one can be read again (4
    # against 3 after the engine tests in one process, here and on the commit before)
    assert large["distinct_adapters"] == plain["sweep n=12"]["distinct_adapters"]


def test_bad_options_are_refused_with_a_message(capsys, tiny_model_dir):
    assert main(["bench", "--online", "--model", str(tiny_model_dir)]) == 1
    assert "--online needs --rate" in capsys.readouterr().err
    assert main(["bench", "--pattern", "zipf"]) == 1
    assert "unknown pattern 'zipf'" in capsys.readouterr().err
    assert main(["bench", "--baseline", "peft", "--endpoint", "http://127.0.0.1:9"]) == 1
    assert "--baseline runs in-process" in capsys.readouterr().err
    assert main(["bench", "--input-len", "9:3"]) == 1
    assert "length range" in capsys.readouterr().err
    assert main(["bench", "--pattern", "base", "--baseline", "peft", "--baseline-patterns", "distinct"]) == 1
    assert "--baseline-patterns distinct must also be in --pattern" in capsys.readouterr().err


def test_latency_case_measures_each_figure_with_and_without_adapters(capsys, tiny_model_dir, tmp_path):
    report_path = tmp_path / "latency.json"
    code = main(
        [
            "bench", "latency", "--model", str(tiny_model_dir), "--device", "cpu", "--rank", "4",
            "--targets", "q_proj,v_proj", "--latency-sizes", "small", "--rounds", "2",
            "--json", str(report_path), "--no-progress",
        ]
    )  # fmt: skip
    assert code == 0
    report = json.loads(report_path.read_text())
    latency = report["latency"]
    assert report["cases"] == []  # the latency case alone: no batch patterns ran
    assert report["engine"]["cpu_threads"] >= 1
    assert set(report["engine"]["startup_phases_s"]) >= {
        "device and model load",
        "kernel warm-up",
        "adapter tiers",
    }
    sizes = LATENCY_SIZES["small"]
    assert latency["sizes"]["ttft_prompt"] == sizes.ttft_prompt
    assert set(latency["median"]) == set(latency["samples"])
    for name, samples in latency["samples"].items():
        assert len(samples) == 2 and all(value > 0 for value in samples), name
        assert latency["median"][name] == pytest.approx(sorted(samples)[0] / 2 + sorted(samples)[1] / 2)
    median = latency["median"]
    assert latency["ratios"]["TTFT: one adapter / base"] == pytest.approx(
        median["TTFT, one adapter"] / median["TTFT, base"]
    )
    assert latency["ratios"]["batch: one adapter / base"] == pytest.approx(
        median["batch, one adapter"] / median["batch, base"]
    )
    out = capsys.readouterr().out
    assert "TTFT of a 256-token prompt" in out and "batch: distinct adapters / base" in out
    # the saved report prints the same figures again
    assert main(["bench", "--from-json", str(report_path)]) == 0
    assert "prefill: distinct adapters / base" in capsys.readouterr().out


def test_latency_case_timers_count_what_ran(tiny_model_dir):
    """Each latency figure divides what the engine produced by a measured time: one token after
    the first for the stream, a first token for TTFT, every prompt token for prefill."""
    from multilora_studio.bench.latency import (
        batch_end_to_end,
        prefill_rate,
        single_stream,
        time_to_first_token,
    )
    from multilora_studio.engine import Engine
    from tests.engine.conftest import tiny_engine_config

    with Engine(tiny_engine_config(tiny_model_dir, device="cpu")) as engine:
        prompts = [[1, 2, 3, 4], [5, 6, 7]]
        started = time.perf_counter()
        rate = prefill_rate(engine, prompts, [None, None])
        elapsed = time.perf_counter() - started
        assert rate >= 7 / elapsed  # 7 prompt tokens in at most the call's time
        started = time.perf_counter()
        ttft = time_to_first_token(engine, [1, 2, 3], None)
        assert 0 < ttft <= time.perf_counter() - started
        started = time.perf_counter()
        generated = batch_end_to_end(engine, prompts, [None, None], 5)
        assert generated >= 10 / (time.perf_counter() - started)
        assert single_stream(engine, [1, 2, 3], None, 6) > 0


def test_latency_case_refuses_an_endpoint_and_a_baseline(capsys):
    assert main(["bench", "latency", "--endpoint", "http://127.0.0.1:9"]) == 1
    assert "bench latency runs in-process" in capsys.readouterr().err
    assert main(["bench", "latency", "--rounds", "0"]) == 1
    assert "--rounds must be >= 1" in capsys.readouterr().err
