"""Launch sweep of the dequantize-GEMM at decode row counts: which ``TileConfig`` reads the
quantized weights fastest on this GPU.

    python -m benchmarks.kernels.dequant_sweep [--rows 1,32] [--budget 240] [--json OUT.json]

For each layout (AWQ, GPTQ 4-bit in groups of 128, FP8 per channel), each projection of the
Llama-3-8B shape (random weights quantized at load) and each row count, every launch of the grid
below is timed inside CUDA graphs (``graph_time_ms``); printed per case: bf16 ``F.linear``, the
default launch (``tile_config``) and the three fastest, with GB/s over the bytes the weights need
and the fraction of the device's copy bandwidth. The grid (``launches``): at one row, GEMV
launches (32 / 64 / 128 columns, 4 or 8 warps) and tensor-core tiles of 16 rows with float32
operands; at more rows, tiles of 16 or 32 rows with bf16 or float32 operands; 4-bit tiles of
64 / 128 / 256 columns (K steps of one group), FP8 tiles of 64 / 128 columns and K steps of 128 /
256; 2 or 4 pipeline stages; K in 1 / 2 / 4 / 8 parts or ``split_k``'s choice; AWQ's words
gathered per column, FP8 converted natively (and by its bits, for GEMV). Every projection at
the first row count is swept before the next row count; ``--budget`` (seconds) stops the sweep
early, reporting what it timed.
"""

from __future__ import annotations

import functools
import itertools
import time
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.quant_gpu import copy_bandwidth_gb_s, projection_shapes
from benchmarks.rounds import graph_time_ms, parser, write_results
from multilora_studio.engine.model.quant_pack import quantize_awq, quantize_fp8, quantize_gptq
from multilora_studio.kernels.dequant_gemm import TileConfig, dequant_gemm, tile_config
from multilora_studio.kernels.quant_weight import QuantizedWeight

SPLITS = (None, 1, 2, 4, 8)
INT4_TILES = ((64, 128, 4), (128, 128, 4), (256, 128, 8))  # (bn, bk, warps); bk: one group a step
FP8_TILES = ((64, 128, 4), (64, 256, 4), (128, 128, 4), (128, 256, 4))
QUANTIZE = {"awq": quantize_awq, "gptq": quantize_gptq, "fp8": quantize_fp8}


def launches(kind: str, rows: int) -> list[TileConfig]:
    """Every launch of the grid (module docstring) for a layout and a row count, GEMV first."""
    gather, native = kind == "awq", kind == "fp8"
    if rows == 1:
        gemv_grid = itertools.product((32, 64, 128), (4, 8), (2, 4), (native, False) if native else (False,))
        gemv = [
            TileConfig(1, bn, 128, w, st, sp, gather=gather, native_fp8=nat, gemv=True)
            for bn, w, st, nat in gemv_grid
            for sp in SPLITS
        ]
        tiles = itertools.product(FP8_TILES if native else INT4_TILES, (2, 4), (True,))
        return gemv + [
            TileConfig(16, bn, bk, 4, st, sp, gather, native, fp32_operands=f32)
            for (bn, bk, _), st, f32 in tiles
            for sp in SPLITS
        ]
    bm = 16 if rows <= 16 else 32
    tiles = itertools.product(FP8_TILES if native else INT4_TILES, (2, 4), (False, True))
    return [
        TileConfig(bm, bn, bk, w, st, sp, gather, native, fp32_operands=f32)
        for (bn, bk, w), st, f32 in tiles
        for sp in SPLITS
    ]


def sweep_case(x: torch.Tensor, weight: QuantizedWeight, deadline: float) -> list[tuple[float, TileConfig]]:
    """(ms, launch) of each launch timed before ``deadline``, fastest first."""
    timed = []
    for config in launches(weight.kind, x.shape[0]):
        if time.monotonic() > deadline:
            break
        try:
            ms = graph_time_ms(functools.partial(dequant_gemm, x, weight, None, config), 10)
        except Exception as error:  # a launch the device cannot run (shared memory, registers)
            print(f"    {config}: {type(error).__name__}: {str(error)[:120]}", flush=True)
            continue
        timed.append((ms, config))
    return sorted(timed, key=lambda pair: pair[0])


def sweep_report(
    group: str,
    kind: str,
    x: torch.Tensor,
    weight: QuantizedWeight,
    bf16_ms: float,
    peak: float,
    deadline: float,
) -> dict[str, Any]:
    """One case swept and printed: bf16, the default launch and the fastest three."""
    rows, (n, k) = x.shape[0], weight.shape
    io_bytes = 2 * rows * (k + n)

    def gb_s(ms: float) -> float:
        return (weight.nbytes + io_bytes) / ms / 1e6

    default_ms = graph_time_ms(functools.partial(dequant_gemm, x, weight, None, tile_config(rows)))
    best = sweep_case(x, weight, deadline)
    print(
        f"{group:8s} {kind:4s} rows {rows:2d}: bf16 {bf16_ms * 1e3:6.1f} us, default "
        f"{default_ms * 1e3:6.1f} us ({gb_s(default_ms) / peak:4.0%} of copy)",
        flush=True,
    )
    for ms, config in best[:3]:
        print(f"    {ms * 1e3:6.1f} us {gb_s(ms):6.0f} GB/s {gb_s(ms) / peak:4.0%}  {config}", flush=True)
    return {
        "group": group,
        "kind": kind,
        "rows": rows,
        "bf16_us": bf16_ms * 1e3,
        "default_us": default_ms * 1e3,
        "timed": len(best),
        "best": [{"us": ms * 1e3, "of_copy": gb_s(ms) / peak, **config.__dict__} for ms, config in best[:5]],
    }


def main() -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--rows", default="1,32", help="row counts of x, comma-separated")
    arguments.add_argument("--budget", type=float, default=240.0, help="seconds before the sweep stops")
    arguments.add_argument("--kinds", default="awq,gptq,fp8")
    args = arguments.parse_args()
    deadline = time.monotonic() + args.budget
    peak = copy_bandwidth_gb_s()
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {peak:.0f} GB/s", flush=True)
    generator = torch.Generator(device="cuda").manual_seed(0)
    kinds = args.kinds.split(",")
    weights: dict[str, tuple[torch.Tensor, dict[str, QuantizedWeight]]] = {}
    for group, (n, k) in projection_shapes("llama3-8b").items():
        dense = (torch.randn(n, k, device="cuda", generator=generator) * k**-0.5).to(torch.bfloat16)
        weights[group] = dense, {kind: QUANTIZE[kind](dense) for kind in kinds}
    results: list[dict[str, Any]] = []
    for rows in (int(r) for r in args.rows.split(",")):
        for group, (dense, quantized) in weights.items():
            x = torch.randn(rows, dense.shape[1], device="cuda", dtype=torch.bfloat16)
            bf16_ms = graph_time_ms(functools.partial(F.linear, x, dense))
            for kind, weight in quantized.items():
                results.append(sweep_report(group, kind, x, weight, bf16_ms, peak, deadline))
    write_results(args.json, {"device": torch.cuda.get_device_name(), "copy_gb_s": peak, "cases": results})


if __name__ == "__main__":
    main()
