"""The LoRA term of prefill-sized steps on a GPU: where its time goes against the base GEMMs.

    python -m benchmarks.kernels.prefill_lora_bench [--budget 120] [--json PATH]

Llama-3-8B projections (q/k/v, o, gate/up, down), bf16, rank 16, 32 slots. Cases: one
2,048-token prompt on one adapter (time to first token) and a 4,096-token step of four
1,024-token prompts on four adapters (prefill of 16 x 1,024). For each projection: the base
GEMM, the slot-grouped shrink and expand as the engine runs them, the base GEMM with the
A rows of the step's leading slots appended (the shrink in GEMM over a slot span) and the
expand reading those rows, then the expand's and the shrink's tiles swept (the fastest per
case). Times are medians of ``triton.testing.do_bench``; sums are over the four projections
times 32 layers, in ms per step. Bytes at the copy bandwidth: x read once by the shrink, y
read and written once by the expand.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import triton

from multilora_studio.kernels import lora_sgmv
from multilora_studio.kernels.lora import LoRABatch, build_lora_batch

PROJECTIONS = {
    "qkv": (4096, (4096, 1024, 1024)),
    "o": (4096, (4096,)),
    "gate_up": (4096, (14336, 14336)),
    "down": (14336, (4096,)),
}
LAYERS, SLOTS, RANK = 32, 32, 16
# (tokens, adapters): each adapter's tokens contiguous, adapters in the leading slots
CASES = {"ttft_2048x1": (2048, 1), "prefill_4096x4": (4096, 4)}


def bench(fn: Callable[[], object]) -> float:
    """Median milliseconds of ``fn``."""
    return float(triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median"))


def copy_bandwidth() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    return 2 * src.numel() / (ms / 1e3)


def offsets(widths: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(itertools.accumulate(widths, initial=0))


def projection_row(
    tokens: int,
    k: int,
    widths: tuple[int, ...],
    span: int,
    batch: LoRABatch,
    bandwidth: float,
    deadline: float,
    device: torch.device | None = None,
) -> dict[str, Any]:
    """One projection's times (ms) at ``tokens`` tokens: GEMM, shrink, expand, the sweeps."""
    device = device or torch.device("cuda")
    n, s = sum(widths), len(widths)
    offs = offsets(widths)
    x = torch.randn(tokens, k, device=device, dtype=torch.bfloat16)
    w = torch.randn(n + SLOTS * s * RANK, k, device=device, dtype=torch.bfloat16) * k**-0.5
    a = torch.randn(SLOTS, s, RANK, k, device=device, dtype=torch.bfloat16) * k**-0.5
    b = torch.randn(SLOTS, n, RANK, device=device, dtype=torch.bfloat16) * 0.01
    y = F.linear(x, w[:n])
    row: dict[str, Any] = {}
    row["gemm"] = bench(lambda: F.linear(x, w[:n]))
    row["gemm_span"] = bench(lambda: F.linear(x, w[: n + span * s * RANK]))
    part = lora_sgmv.shrink_partials(x, a, batch)
    row["splits"] = part.shape[0]
    row["shrink"] = bench(lambda: lora_sgmv.shrink_partials(x, a, batch))
    row["expand"] = bench(lambda: lora_sgmv.expand(y, part, b, batch, offs))
    one = lora_sgmv.shrink_partials(x, a, batch, config=lora_sgmv.ShrinkConfig(64, 64, 64, 1))
    row["expand_1split"] = bench(lambda: lora_sgmv.expand(y, one, b, batch, offs))
    row["floor_shrink"] = 1e3 * x.numel() * 2 / bandwidth
    row["floor_expand"] = 1e3 * 2 * y.numel() * 2 / bandwidth
    sweep: dict[str, Any] = {}  # the expand's tiles
    for bm, bn, warps, stages in itertools.product((64, 128), (64, 128, 256), (4, 8), (2,)):
        if time.perf_counter() > deadline:
            break
        cfg = lora_sgmv.ExpandConfig(bm, bn, warps, stages)
        try:
            sweep[f"bm{bm}_bn{bn}_w{warps}_s{stages}"] = bench(
                functools.partial(lora_sgmv.expand, y, one, b, batch, offs, config=cfg)
            )
        except Exception as error:  # an out-of-resources tile is skipped
            sweep[f"bm{bm}_bn{bn}_w{warps}_s{stages}"] = repr(error)[:80]
    timed = {key: v for key, v in sweep.items() if isinstance(v, float)}
    if timed:
        row["expand_best"] = min(timed.items(), key=lambda kv: kv[1])
    shrink_sweep: dict[str, Any] = {}
    bn = min(64, max(16, 1 << (s * RANK - 1).bit_length()))
    for bm, bk, split, warps in itertools.product((64, 128), (64, 128), (1, 2, 4), (4,)):
        if time.perf_counter() > deadline:
            break
        scfg = lora_sgmv.ShrinkConfig(bm, bn, bk, split, warps, 3)
        try:
            shrink_sweep[f"bm{bm}_bk{bk}_split{split}_w{warps}"] = bench(
                functools.partial(lora_sgmv.shrink_partials, x, a, batch, config=scfg)
            )
        except Exception as error:
            shrink_sweep[f"bm{bm}_bk{bk}_split{split}_w{warps}"] = repr(error)[:80]
    timed = {key: v for key, v in shrink_sweep.items() if isinstance(v, float)}
    if timed:
        row["shrink_best"] = min(timed.items(), key=lambda kv: kv[1])
    row["expand_sweep"], row["shrink_sweep"] = sweep, shrink_sweep
    return row


def run_case(name: str, tokens: int, adapters: int, deadline: float, bandwidth: float) -> dict[str, Any]:
    device = torch.device("cuda")
    per = tokens // adapters
    slot_ids = torch.arange(tokens, device=device, dtype=torch.int32) // per  # [T]
    slot_ranks = torch.zeros(SLOTS, dtype=torch.int32, device=device)
    slot_ranks[:] = RANK
    batch = build_lora_batch(slot_ids, slot_ranks, SLOTS)
    span = 1 << max(adapters - 1, 0).bit_length()  # the engine's slot span
    result: dict[str, Any] = {"tokens": tokens, "adapters": adapters, "span": span, "projections": {}}
    for proj, (k, widths) in PROJECTIONS.items():
        if time.perf_counter() > deadline:
            result["cut_short"] = True
            break
        row = projection_row(tokens, k, widths, span, batch, bandwidth, deadline)
        result["projections"][proj] = row
        print(
            f"{name} {proj:8s} gemm {row['gemm']:.3f} +span {row['gemm_span'] - row['gemm']:+.3f} "
            f"shrink {row['shrink']:.3f} (floor {row['floor_shrink']:.3f}, best {row.get('shrink_best')}) "
            f"expand {row['expand']:.3f} (1 split {row['expand_1split']:.3f}, "
            f"floor {row['floor_expand']:.3f}, "
            f"best {row.get('expand_best')}) ms",
            flush=True,
        )
        torch.cuda.empty_cache()
    done = result["projections"].values()
    for key in ("gemm", "gemm_span", "shrink", "expand", "expand_1split", "floor_shrink", "floor_expand"):
        result[f"sum_{key}_ms"] = LAYERS * sum(row[key] for row in done)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--budget", type=float, default=120.0, help="seconds for the whole run")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    deadline = time.perf_counter() + args.budget
    bandwidth = copy_bandwidth()
    results: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "copy_GBps": bandwidth / 1e9, "cases": {}}
    print(f"{results['gpu']}: copy {bandwidth / 1e9:.0f} GB/s", flush=True)
    for name, (tokens, adapters) in CASES.items():
        results["cases"][name] = run_case(name, tokens, adapters, deadline, bandwidth)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
    for name, case in results["cases"].items():
        print(
            f"{name}: per step over {LAYERS} layers (ms): gemm {case['sum_gemm_ms']:.2f}, "
            f"span rows {case['sum_gemm_span_ms'] - case['sum_gemm_ms']:+.2f}, "
            f"shrink {case['sum_shrink_ms']:.2f} "
            f"(floor {case['sum_floor_shrink_ms']:.2f}), expand {case['sum_expand_ms']:.2f} "
            f"(1 split {case['sum_expand_1split_ms']:.2f}, floor {case['sum_floor_expand_ms']:.2f})"
        )


if __name__ == "__main__":
    main()
