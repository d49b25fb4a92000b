"""Engine decode throughput on CUDA at the Llama-3-8B shape (random bf16 weights), in one run.

    python -m benchmarks.engine_gpu [--json PATH]

Measures base-only and 32-distinct-adapter decode throughput at batch 32 (128-token
prompts, 64 new tokens, rank 16 on all seven projections; with CUDA graphs the two
alternate ``--rounds`` times and the medians are reported), the weight-bandwidth
ceiling from a measured copy bandwidth, and checks that CUDA-graph decode gives the
same tokens as eager execution.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from benchmarks.rounds import report_lines
from multilora_studio.bench.random_adapters import write_random_adapter
from multilora_studio.engine import Engine, EngineConfig, SamplingParams, ServingEngine
from multilora_studio.engine.loop.diagnostics import step_profile, time_decode_graph
from multilora_studio.engine.model.model_source import RANDOM_SHAPES

log = logging.getLogger(__name__)


def copy_bandwidth(device: torch.device, size_bytes: int = 2 << 30) -> float:
    """Bytes/s of a large device-to-device copy (read + write counted)."""
    src = torch.empty(size_bytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize(device)
    return 2 * size_bytes * 10 / (start.elapsed_time(end) / 1e3)


def run_batch(
    engine: ServingEngine, prompts: list[list[int]], adapters: Sequence[str | None], new_tokens: int
) -> dict:
    """Submit all requests at once; time to first tokens and the decode phase after it."""
    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    start = time.perf_counter()
    outputs = engine.generate(prompts, adapters, params)
    end = time.perf_counter()
    first = max(o.first_token_time or end for o in outputs)
    finish = max(o.finish_time or end for o in outputs)
    decode_tokens = sum(len(o.token_ids) - 1 for o in outputs)
    return {
        "end_to_end_tok_s": sum(len(o.token_ids) for o in outputs) / (end - start),
        "decode_tok_s": decode_tokens / (finish - first),
        "tokens": [o.token_ids for o in outputs],
    }


def phase_ms_per_step(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Milliseconds per step by phase between two ``diagnostics.step_profile`` snapshots."""
    steps = max(1.0, after["steps"] - before["steps"])
    return {k: round(1e3 * (after[k] - before.get(k, 0.0)) / steps, 4) for k in after if k != "steps"}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", default="llama3-8b")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument(
        "--shrink-in-gemm",
        choices=("auto", "on", "off"),
        default="auto",
        help="EngineConfig.lora_shrink_in_gemm: auto (the engine's rule), on or off",
    )
    parser.add_argument(
        "--fused-qkv-epilogue",
        choices=("auto", "on", "off"),
        default="auto",
        help="EngineConfig.fused_qkv_epilogue: auto (on with CUDA), on or off",
    )
    parser.add_argument(
        "--batch-invariant",
        action="store_true",
        help="EngineConfig.batch_invariant: every row the same bits whatever the batch holds",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternating base / distinct runs with graphs (medians)"
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    shrink_in_gemm = {"auto": None, "on": True, "off": False}[args.shrink_in_gemm]
    fused_qkv = {"auto": None, "on": True, "off": False}[args.fused_qkv_epilogue]
    logging.basicConfig(level=logging.INFO)
    device = torch.device("cuda")
    spec = RANDOM_SHAPES[args.shape]
    results: dict = {
        "shape": args.shape,
        "batch": args.batch,
        "rank": args.rank,
        "shrink_in_gemm": args.shrink_in_gemm,
        "fused_qkv_epilogue": args.fused_qkv_epilogue,
        "batch_invariant": args.batch_invariant,
        "gpu": torch.cuda.get_device_name(),
    }

    bandwidth = copy_bandwidth(device)
    weight_bytes = spec.num_parameters() * 2
    results["copy_bandwidth_GBps"] = bandwidth / 1e9
    results["weight_GB"] = weight_bytes / 1e9
    results["ceiling_tok_s"] = args.batch * bandwidth / weight_bytes

    workdir = Path(tempfile.mkdtemp(prefix="mls-gpu-bench-"))
    adapter_dirs = {
        f"a{i}": write_random_adapter(spec, workdir / f"a{i}", args.rank, seed=i, dtype=torch.bfloat16)
        for i in range(args.batch)
    }
    generator = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(0, spec.vocab_size, (args.prompt_len,), generator=generator).tolist()
        for _ in range(args.batch)
    ]
    distinct = list(adapter_dirs)
    base_only: list[str | None] = [None] * args.batch
    tokens_by_mode = {}
    for eager in (False, True):
        config = EngineConfig(
            model=f"random:{args.shape}",
            device="cuda",
            dtype="bfloat16",
            max_loras=args.batch,
            max_lora_rank=args.rank,
            max_num_seqs=args.batch,
            max_model_len=args.prompt_len + args.new_tokens + 16,
            max_num_batched_tokens=max(2048, args.batch * args.prompt_len),
            enforce_eager=eager,
            lora_shrink_in_gemm=shrink_in_gemm,
            fused_qkv_epilogue=fused_qkv,
            batch_invariant=args.batch_invariant,
        )
        start = time.perf_counter()
        with Engine(config) as engine:
            mode = "eager" if eager else "graphs"
            results[f"{mode}_startup_s"] = time.perf_counter() - start
            start = time.perf_counter()
            for name, path in adapter_dirs.items():
                engine.add_adapter(name, path)
            results["add_adapter_s_each"] = (time.perf_counter() - start) / len(adapter_dirs)
            run_batch(engine, prompts, distinct, 8)  # warm-up: adapters into slots, kernels compiled
            run_batch(engine, prompts, base_only, 8)
            # base and 32 distinct alternate, `rounds` times with graphs: the medians and their
            # ratio, so one slow run of either does not decide the ratio
            base_rounds, mixed_rounds = [], []
            for _ in range(1 if eager else args.rounds):
                before_base = step_profile(engine)
                base = run_batch(engine, prompts, base_only, args.new_tokens)
                before_mixed = step_profile(engine)
                mixed = run_batch(engine, prompts, distinct, args.new_tokens)
                after_mixed = step_profile(engine)
                base_rounds.append(base)
                mixed_rounds.append(mixed)
                if base["tokens"] != base_rounds[0]["tokens"] or mixed["tokens"] != mixed_rounds[0]["tokens"]:
                    results[f"{mode}_rounds_differ"] = True  # greedy decoding must repeat itself
            # host ms per step of the last round's runs (prefill step and decode steps), by phase
            results[f"{mode}_base_run_step_ms"] = phase_ms_per_step(before_base, before_mixed)
            results[f"{mode}_distinct_run_step_ms"] = phase_ms_per_step(before_mixed, after_mixed)
            base_tok_s = [run["decode_tok_s"] for run in base_rounds]
            mixed_tok_s = [run["decode_tok_s"] for run in mixed_rounds]
            base_median, mixed_median = statistics.median(base_tok_s), statistics.median(mixed_tok_s)
            results[f"{mode}_base_decode_tok_s"] = base_median
            results[f"{mode}_base_end_to_end_tok_s"] = statistics.median(
                r["end_to_end_tok_s"] for r in base_rounds
            )
            results[f"{mode}_distinct_decode_tok_s"] = mixed_median
            results[f"{mode}_distinct_end_to_end_tok_s"] = statistics.median(
                r["end_to_end_tok_s"] for r in mixed_rounds
            )
            results[f"{mode}_distinct_over_base"] = mixed_median / base_median
            results[f"{mode}_rounds"] = {
                "base_decode_tok_s": base_tok_s,
                "distinct_decode_tok_s": mixed_tok_s,
                "ratio_each": [m / b for m, b in zip(mixed_tok_s, base_tok_s, strict=True)],
            }
            tokens_by_mode[mode] = (base["tokens"], mixed["tokens"])
            profile = step_profile(engine)
            steps = max(1.0, profile.pop("steps"))
            results[f"{mode}_step_ms"] = {k: 1e3 * v / steps for k, v in profile.items()}
            if not eager:
                for uses_lora in (False, True):
                    results[f"graph_replay_ms_lora_{uses_lora}"] = time_decode_graph(
                        engine, args.batch, uses_lora
                    )
            results[f"{mode}_adapters_change_output"] = sum(
                b != m for b, m in zip(base["tokens"], mixed["tokens"], strict=True)
            )
    results["graph_equals_eager_base"] = tokens_by_mode["graphs"][0] == tokens_by_mode["eager"][0]
    results["graph_equals_eager_distinct"] = tokens_by_mode["graphs"][1] == tokens_by_mode["eager"][1]
    results["base_fraction_of_ceiling"] = results["graphs_base_decode_tok_s"] / results["ceiling_tok_s"]

    print()
    report_lines(results, args.json, 36)


if __name__ == "__main__":
    main()
