"""``multilora-studio bench``: the Punica and S-LoRA workloads in-process or against an endpoint."""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
from pathlib import Path

from multilora_studio.bench.adapter_pool import parse_targets
from multilora_studio.bench.cases import BenchOptions
from multilora_studio.bench.stats import Slo
from multilora_studio.bench.workloads import PATTERNS, parse_range
from multilora_studio.cli.setting_flags import add_setting_flag
from multilora_studio.cli.shared import Subcommands
from multilora_studio.deploy.dispatch_rule import DEFAULT_MARGIN
from multilora_studio.engine import EngineConfig
from multilora_studio.util import extra_install_hint

log = logging.getLogger(__name__)


def parse_list(text: str, kind: type, name: str) -> tuple:
    try:
        values = tuple(kind(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"{name} takes a comma-separated list, got {text!r}") from None
    if not values:
        raise ValueError(f"{name} takes a comma-separated list, got {text!r}")
    return values


def parse_patterns(text: str) -> tuple[str, ...]:
    return PATTERNS if text.strip() == "all" else parse_list(text, str, "--pattern")


def add_bench_command(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmark the engine (or an endpoint) on the Punica and S-LoRA workloads",
        description="Measure throughput, latency and adapter caching on Punica's batch popularity "
        "patterns and S-LoRA's online workload, in-process or against any OpenAI-compatible "
        "endpoint. Without --pattern, --online or --sweep-adapters it runs all patterns; "
        "'bench latency' measures single-stream decode, TTFT, prefill and end-to-end batches with "
        "and without adapters instead. Details: docs/bench.md.",
    )
    parser.add_argument(
        "case",
        nargs="?",
        choices=["latency"],
        help="latency: single stream, TTFT, prefill and batch end to end, base against adapters",
    )
    setup = parser.add_argument_group("model and engine")
    setup.add_argument("--model", default=None, help="HF folder, random:llama3-8b, ... (default: embedded)")
    for name in ("device", "dtype", "max_loras", "max_cpu_loras", "adapter_load_workers", "adapter_loader"):
        add_setting_flag(setup, EngineConfig, name)
    setup.add_argument(
        "--prefetch-host",
        action="store_true",
        help="read each online/sweep case's most popular adapters into host RAM first (S-LoRA's setting)",
    )
    setup.add_argument(
        "--sample-stacks",
        action="store_true",
        help="sample thread stacks every 2 ms and print what each case's slowest steps waited on",
    )
    add_setting_flag(
        setup, EngineConfig, "max_num_seqs", default=None, help="running requests (default: --batch)"
    )
    add_setting_flag(setup, EngineConfig, "kv_cache_memory_gb")
    adapters = parser.add_argument_group("random adapters")
    adapters.add_argument("--rank", type=int, default=16, help="rank of every random adapter")
    adapters.add_argument("--targets", default="all", help="'all' or e.g. q_proj,v_proj")
    adapters.add_argument("--num-adapters", type=int, default=32, help="adapters of the online workload")
    adapters.add_argument(
        "--distinct-weights", type=int, default=8, help="weight files written; other adapters link to them"
    )
    adapters.add_argument("--adapter-dir", type=Path, default=None, help="keep the adapters here")
    work = parser.add_argument_group("workloads")
    work.add_argument("--batch", type=int, default=8, help="batch size of the patterns")
    work.add_argument("--pattern", default=None, help=f"'all' or a list of {', '.join(PATTERNS)}")
    work.add_argument("--online", action="store_true", help="S-LoRA's online workload at each --rate")
    work.add_argument("--rate", default=None, help="requests/s of the online workload, e.g. 2,8")
    work.add_argument("--cv", type=float, default=1.0, help="burstiness: CV of the gaps (1 = Poisson)")
    work.add_argument("--alpha", type=float, default=1.0, help="power-law exponent of adapter popularity")
    work.add_argument("--duration", type=float, default=10.0, help="seconds of arrivals per online case")
    work.add_argument("--input-len", default="64", help="prompt tokens: N or LOW:HIGH")
    work.add_argument("--output-len", default="32", help="output tokens: N or LOW:HIGH")
    work.add_argument("--sweep-adapters", default=None, help="numbers of adapters, e.g. 1,8,32,128")
    work.add_argument("--sweep-rate", default="inf", help="rate of the sweep (inf: all at once)")
    work.add_argument(
        "--requests",
        default=None,
        help="requests per inf-rate case (default 4x batch); a list (256,4096,16384) sweeps the queue depth",
    )
    work.add_argument("--seed", type=int, default=0, help="seed of the workload and the adapter weights")
    work.add_argument("--no-warmup", action="store_true", help="measure the first batch too")
    work.add_argument(
        "--latency-sizes",
        choices=["auto", "full", "small"],
        default="auto",
        help="bench latency's sizes: full (2,048-token TTFT, 16 x 1,024 prefill, batch 32), small "
        "(a CPU's), auto (small on the CPU)",
    )
    work.add_argument("--rounds", type=int, default=3, help="bench latency's alternating rounds (medians)")
    routing = parser.add_argument_group("routing study (simulated; docs/scale-out.md)")
    routing.add_argument(
        "--routing-sim",
        action="store_true",
        help="simulate many replicas under each routing policy with this engine's measured costs; no run",
    )
    routing.add_argument("--sim-adapters", default="1000,10000", help="adapter counts (Zipf 1.0 popularity)")
    routing.add_argument("--sim-replicas", default="8,64,512", help="replica counts")
    routing.add_argument("--sim-loads", default="0.5,0.7,0.9", help="arrival rates over the capacity")
    routing.add_argument("--sim-requests-per-replica", type=int, default=200, help="requests simulated")
    routing.add_argument(
        "--affinity-margin", type=int, default=DEFAULT_MARGIN, help="affinity: requests over the least"
    )
    measure = parser.add_argument_group("measurement and output")
    measure.add_argument("--ttft-slo-ms", type=float, default=6000.0, help="TTFT target (0: none)")
    measure.add_argument("--tpot-slo-ms", type=float, default=0.0, help="TPOT target (0: none)")
    measure.add_argument("--baseline", choices=["peft"], default=None, help="same patterns through PEFT")
    measure.add_argument("--baseline-output-len", type=int, default=None, help="PEFT output tokens")
    measure.add_argument("--baseline-patterns", default=None, help="patterns to run through PEFT (all)")
    measure.add_argument(
        "--bandwidth-gbps", type=float, default=None, help="memory bandwidth (default: measured)"
    )
    measure.add_argument("--endpoint", default=None, help="base URL of an OpenAI-compatible server")
    measure.add_argument("--api-key", default=None, help="bearer key for --endpoint")
    measure.add_argument("--json", type=Path, default=None, help="write the report here")
    measure.add_argument("--plot", type=Path, default=None, help="write PNG charts into this folder")
    measure.add_argument("--no-progress", action="store_true", help="no progress bar")
    measure.add_argument(
        "--from-json", type=Path, default=None, help="print (and --plot) a report saved with --json; no run"
    )
    parser.set_defaults(handler=run_bench_command)


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    return BenchOptions(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        rank=args.rank,
        targets=parse_targets(args.targets),
        num_adapters=args.num_adapters,
        distinct_weights=args.distinct_weights,
        max_loras=args.max_loras,
        max_cpu_loras=args.max_cpu_loras,
        load_workers=args.load_workers,
        adapter_loader=args.adapter_loader,
        prefetch_host=args.prefetch_host,
        sample_stacks=args.sample_stacks,
        max_num_seqs=args.max_num_seqs,
        kv_cache_gb=args.kv_cache_gb,
        batch=args.batch,
        patterns=parse_patterns(args.pattern) if args.pattern else (),
        online=args.online,
        rates=parse_list(args.rate, float, "--rate") if args.rate else (),
        cv=args.cv,
        alpha=args.alpha,
        duration=args.duration,
        input_len=parse_range(args.input_len),
        output_len=parse_range(args.output_len),
        sweep_adapters=parse_list(args.sweep_adapters, int, "--sweep-adapters")
        if args.sweep_adapters
        else (),
        sweep_rate=parse_list(args.sweep_rate, float, "--sweep-rate")[0],
        requests=parse_list(args.requests, int, "--requests") if args.requests else (),
        seed=args.seed,
        slo=Slo(args.ttft_slo_ms / 1e3 or None, args.tpot_slo_ms / 1e3 or None),
        baseline=args.baseline,
        baseline_output_len=args.baseline_output_len,
        baseline_patterns=parse_patterns(args.baseline_patterns) if args.baseline_patterns else (),
        bandwidth_gbps=args.bandwidth_gbps,
        endpoint=args.endpoint,
        api_key=args.api_key,
        adapter_dir=args.adapter_dir,
        warmup=not args.no_warmup,
        progress=not args.no_progress,
        latency=args.latency_sizes if args.case == "latency" else None,
        latency_rounds=args.rounds,
    )


def run_bench_command(args: argparse.Namespace) -> int:
    from multilora_studio.bench.plots import require_matplotlib, write_plots
    from multilora_studio.bench.report import render, write_json
    from multilora_studio.bench.suite import run_bench

    if args.routing_sim:
        return run_routing_sim(args)
    if args.plot is not None:
        require_matplotlib()
    if args.from_json is not None:
        report = json.loads(args.from_json.read_text())
    else:
        options = options_from_args(args)
        if options.baseline == "peft" and importlib.util.find_spec("peft") is None:
            raise ValueError(f"--baseline peft needs peft: {extra_install_hint('bench')}")
        if math.isinf(options.sweep_rate) and options.sweep_adapters:
            log.info("sweep: %s requests per case, all at once", ",".join(map(str, options.requests)))
        checkpoint = (lambda partial: write_json(partial, args.json)) if args.json is not None else None
        report = run_bench(options, checkpoint)
        if args.json is not None:
            write_json(report, args.json)
            log.info("wrote %s", args.json)
    if args.plot is not None:
        write_plots(report, args.plot)
    print(render(report), flush=True)
    failed = sum(case["errors"] for case in report["cases"])
    return 1 if failed else 0


def run_routing_sim(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from multilora_studio.bench.routing_sim import render, study

    outcomes = []
    for outcome in study(
        parse_list(args.sim_adapters, int, "--sim-adapters"),
        parse_list(args.sim_replicas, int, "--sim-replicas"),
        parse_list(args.sim_loads, float, "--sim-loads"),
        requests_per_replica=args.sim_requests_per_replica,
        margin=args.affinity_margin,
        seed=args.seed,
    ):
        outcomes.append(outcome)
        log.info("simulated %s", outcome.scenario)
    print(render(outcomes), flush=True)
    if args.json is not None:
        rows = [
            {**asdict(o.scenario), **{k: v for k, v in asdict(o).items() if k != "scenario"}}
            for o in outcomes
        ]
        args.json.write_text(json.dumps(rows, indent=1))
    return 0
