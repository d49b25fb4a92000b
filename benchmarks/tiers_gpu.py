"""Adapter tiers on CUDA at the Llama-3-8B shape: slot uploads, decode during cold loads, Zipf traffic.

    python -m benchmarks.tiers_gpu [--json PATH]

1. Upload of one rank-16 all-projection adapter (about 84 MB in bf16) into its GPU slot
   against one plain pinned host-to-device copy of the same bytes.
2. Decode throughput of 16 running base requests alone, and while requests for cold
   adapters (read from disk, packed, uploaded) keep arriving.
3. Zipf(1.0) popularity over 200 adapters with 16 slots: slot and host-tier hit rates, TTFT.
Adapter folders share a few distinct weight files through hard links; each is still a
separate adapter to the engine (read, validated, packed and uploaded on its own).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

from multilora_studio.bench.random_adapters import write_random_adapter
from multilora_studio.bench.stack_sampler import StackSampler, explain_slow_steps
from multilora_studio.engine import Engine, EngineConfig, EngineMetrics, SamplingParams
from multilora_studio.engine.loop.diagnostics import time_slot_upload
from multilora_studio.engine.model.model_source import RANDOM_SHAPES
from multilora_studio.engine.step.step_trace import records_as_dicts, summarize


def adapter_farm(root: Path, count: int, distinct: int, rank: int, shape: str) -> list[Path]:
    """``count`` adapter folders over ``distinct`` weight files (hard links)."""
    spec = RANDOM_SHAPES[shape]
    sources = [
        write_random_adapter(spec, root / f"src{i}", rank, seed=i, dtype=torch.bfloat16)
        for i in range(distinct)
    ]
    folders = []
    for index in range(count):
        folder = root / f"a{index}"
        folder.mkdir()
        source = sources[index % distinct]
        shutil.copy(source / "adapter_config.json", folder / "adapter_config.json")
        os.link(source / "adapter_model.safetensors", folder / "adapter_model.safetensors")
        folders.append(folder)
    return folders


def snapshot(engine: Engine) -> EngineMetrics:
    metrics = engine.metrics(fresh=True)
    if metrics is None:
        raise RuntimeError("the engine published no metrics")
    return metrics


def decode_rate(outputs) -> float:
    first = max(o.first_token_time for o in outputs)
    last = max(o.finish_time for o in outputs)
    return sum(len(o.token_ids) - 1 for o in outputs) / (last - first)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", default="llama3-8b")
    parser.add_argument("--adapters", type=int, default=200)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument(
        "--device", default="cuda", help="cuda; cpu runs the same flow without the upload timing"
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--cpu-threads", type=int, default=None, help="torch.set_num_threads for the process")
    parser.add_argument("--switch-interval", type=float, default=None, help="sys.setswitchinterval (s)")
    parser.add_argument("--skip-zipf", action="store_true", help="stop after the cold-load phase")
    parser.add_argument("--adapter-loader", choices=("auto", "thread", "process"), default="auto")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--load-workers", type=int, default=None, help="adapter loads at once")
    parser.add_argument(
        "--sample-stacks",
        action="store_true",
        help="sample thread stacks in the cold phase; explain slow steps",
    )
    args = parser.parse_args()
    if args.cpu_threads:
        torch.set_num_threads(args.cpu_threads)
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    spec = RANDOM_SHAPES[args.shape]
    results: dict = {
        "shape": args.shape,
        "adapters": args.adapters,
        "slots": args.slots,
        "cpu_threads": torch.get_num_threads(),
        "switch_interval_s": sys.getswitchinterval(),
        "rank": args.rank,
    }
    root = Path(tempfile.mkdtemp(prefix="mls-tiers-"))
    folders = adapter_farm(root, args.adapters, 8, args.rank, args.shape)
    config = EngineConfig(
        model=f"random:{args.shape}",
        device=args.device,
        dtype="bfloat16" if args.device == "cuda" else "float32",
        max_loras=args.slots,
        max_cpu_loras=64,
        max_lora_rank=args.rank,
        max_num_seqs=48,
        adapter_loader=args.adapter_loader,
        adapter_load_workers=args.load_workers,
        max_model_len=320,
        max_num_batched_tokens=4096,
    )
    device_type = torch.device(args.device).type
    results["adapter_loader"] = config.loader_for(device_type)
    results["load_workers"] = config.load_workers_for(device_type)
    rng = np.random.default_rng(0)

    def prompt(length: int) -> list[int]:
        return rng.integers(0, spec.vocab_size, length).tolist()

    with Engine(config) as engine:
        for index, folder in enumerate(folders):
            engine.add_adapter(f"a{index}", folder, preload=False)
        engine.generate([prompt(16)], ["a0"], SamplingParams(max_tokens=2, temperature=0))
        if args.device == "cuda":
            results["upload"] = time_slot_upload(engine, "a0")

        base = SamplingParams(max_tokens=96, temperature=0, ignore_eos=True)
        running = [prompt(64) for _ in range(16)]
        window = time.perf_counter()
        results["decode_alone_tok_s"] = decode_rate(engine.generate(running, [None] * 16, base))
        traces = {"alone": engine.step_trace.snapshot(since=window)}
        window = time.perf_counter()
        sampler = StackSampler() if args.sample_stacks else None
        if sampler is not None:
            sampler.start()
        streams = [engine.submit(p, None, base) for p in running]
        next(iter(streams[0]))
        cold = []

        first_cold = args.adapters // 2
        last_cold = min(args.adapters, first_cold + 24)

        def cold_traffic() -> None:
            for index in range(first_cold, last_cold):  # not used before: disk -> host -> slot
                cold.append(engine.submit(prompt(16), f"a{index}", SamplingParams(max_tokens=1)))
                time.sleep(0.02)

        feeder = threading.Thread(target=cold_traffic)
        feeder.start()
        outputs = [s.result() for s in streams]
        feeder.join()
        cold_outputs = [s.result() for s in cold]
        traces["cold"] = engine.step_trace.snapshot(since=window)
        if sampler is not None:
            sampler.stop()
            results["slow_steps"] = explain_slow_steps(traces["cold"], sampler)
        results["decode_during_cold_loads_tok_s"] = decode_rate(outputs)
        results["decode_ratio"] = results["decode_during_cold_loads_tok_s"] / results["decode_alone_tok_s"]
        results["cold_requests_done"] = sum(o.finish_reason == "length" for o in cold_outputs)
        # Control: short requests for adapters already in GPU slots (the last ones loaded),
        # answered at the same offsets into the decode as the cold ones were: the same
        # prefills join the decode steps, nothing is loaded.
        start = min(o.first_token_time or 0.0 for o in outputs)
        offsets = sorted(o.first_token_time - start for o in cold_outputs if o.first_token_time)
        warm_names = [f"a{index}" for index in range(max(first_cold, last_cold - args.slots), last_cold)]
        window = time.perf_counter()
        streams = [engine.submit(p, None, base) for p in running]
        next(iter(streams[0]))
        warm_start = time.monotonic()
        warm = []

        def warm_traffic() -> None:
            for index, offset in enumerate(offsets):
                time.sleep(max(0.0, warm_start + offset - time.monotonic()))
                name = warm_names[index % len(warm_names)]
                warm.append(engine.submit(prompt(16), name, SamplingParams(max_tokens=1)))

        feeder = threading.Thread(target=warm_traffic)
        feeder.start()
        outputs = [s.result() for s in streams]
        feeder.join()
        for stream in warm:
            stream.result()
        traces["warm"] = engine.step_trace.snapshot(since=window)
        results["step_trace"] = {name: summarize(records) for name, records in traces.items()}
        results["step_records"] = {name: records_as_dicts(records) for name, records in traces.items()}
        print_trace(results["step_trace"])
        results["decode_during_warm_requests_tok_s"] = decode_rate(outputs)
        results["decode_ratio_vs_warm_requests"] = (
            results["decode_during_cold_loads_tok_s"] / results["decode_during_warm_requests_tok_s"]
        )

        results["cold_load_p50_s"] = snapshot(engine).cold_load_p50_s
        if args.skip_zipf:
            write_results(results, args, root)
            return
        before = snapshot(engine)
        ranks = np.arange(1, args.adapters + 1)
        weights = 1.0 / ranks
        picks = rng.choice(args.adapters, size=96, p=weights / weights.sum())
        start = time.perf_counter()
        zipf = engine.generate(
            [prompt(64) for _ in picks],
            [f"a{i}" for i in picks],
            SamplingParams(max_tokens=16, temperature=0, ignore_eos=True),
        )
        elapsed = time.perf_counter() - start
        after = snapshot(engine)
        ttft = sorted(o.ttft or 0.0 for o in zipf)
        gpu = (after.gpu_hits - before.gpu_hits, after.gpu_misses - before.gpu_misses)
        cpu = (after.cpu_hits - before.cpu_hits, after.cpu_misses - before.cpu_misses)
        results["zipf"] = {
            "requests": len(zipf),
            "distinct_adapters": len(set(picks.tolist())),
            "gpu_slot_hit_rate": gpu[0] / max(1, sum(gpu)),
            "host_tier_hit_rate": cpu[0] / max(1, sum(cpu)),
            "ttft_p50_s": ttft[len(ttft) // 2],
            "ttft_p95_s": ttft[int(0.95 * (len(ttft) - 1))],
            "output_tok_s": sum(len(o.token_ids) for o in zipf) / elapsed,
            "cold_load_p50_s": after.cold_load_p50_s,
            "cold_load_p95_s": after.cold_load_p95_s,
        }
    write_results(results, args, root)


def print_trace(summaries: dict) -> None:
    """Steps of the three decode phases side by side: where a slower phase lost its time."""
    print(
        "step trace      steps  wall s  graph n/p50/p90 ms   eager n/p50/p90 ms   gaps / schedule sum ms"
        "  prompt tok"
    )
    for name, summary in summaries.items():
        if not summary.get("steps"):
            continue
        graph, eager = summary["graph_steps"], summary["eager_steps"]
        gaps, schedule = summary["gaps"].get("sum_ms", 0.0), summary["schedule"].get("sum_ms", 0.0)

        def cell(stats: dict) -> str:
            if not stats["count"]:
                return f"{0:>4} {'-':>6} {'-':>6}"
            return f"{stats['count']:>4} {stats['p50_ms']:6.2f} {stats['p90_ms']:6.2f}"

        print(
            f"  {name:<12} {summary['steps']:>5} {summary['wall_s']:7.3f}  {cell(graph)}   {cell(eager)}"
            f"   {gaps:7.1f} / {schedule:7.1f}      {summary['eager_prompt_tokens']:>10}"
        )


def write_results(results: dict, args: argparse.Namespace, root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({k: v for k, v in results.items() if k != "step_records"}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
