"""Weight-only 4-bit and FP8 GEMMs side by side on the Llama-3-8B projections, at every row count
a step sees: which kernel serves which case (``kernels/int4_gemm.py``, ``kernels/fp8_gemm.py``).

    python -m benchmarks.kernels.quant_candidates [--rows 1,2,4,8,16,32,64,128,512,2048] [--json OUT.json]

One random bf16 weight per projection, quantized round-to-nearest (4-bit in groups of 128,
``quant_pack.int4_groups``; FP8 per channel). Candidates, all on the same stored values:

* ``bf16``: ``F.linear`` on the float weight, the baseline;
* ``int4-gemlite``: gemlite's A16W4 kernels (GEMV / split-K / GEMM by rows, its launch table)
  on the K-packed layout, bf16 activations, fp16 scales and zero points (``Int4Gemm``);
* ``int4-dense``: the weight dequantized into a bf16 buffer (``kernels/int4_dequant.py``), then
  cuBLAS (``Int4Gemm.dense_product``), the dequantization included in the time;
* ``int4-tinygemm``: PyTorch's ``aten._weight_int4pack_mm`` (bf16 scale/zero pairs), for reference;
* ``fp8-gemlite``: gemlite's A16W8 weight-only kernels on the e4m3 bytes (``Fp8Gemm``);
* ``fp8-scaled_mm``: ``torch._scaled_mm`` with per-row activation scales (FP8 tensor cores).

Each case runs inside one CUDA graph over enough copies of the weight to read past the L2
cache (as a model's layers do). Printed per case: microseconds, the fraction of copy bandwidth
over the weight's bytes, and the error against float64 over the exact dequantized weight (max
absolute difference over the reference's largest magnitude).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.quant_gpu import copy_bandwidth_gb_s, projection_shapes
from benchmarks.rounds import graph_time_ms, parser, write_results
from multilora_studio.engine.model.quant_pack import (
    int4_groups,
    pack_gptq_rows,
    pack_sequential,
    quantize_fp8,
)
from multilora_studio.kernels.fp8_gemm import Fp8Gemm
from multilora_studio.kernels.fp8_scaled_mm import fp8_scaled_mm
from multilora_studio.kernels.int4_gemm import Int4Gemm
from multilora_studio.kernels.quant_weight import GROUP_SIZE, QuantizedWeight, dequantize

L2_FLUSH_BYTES = 256 * 2**20  # copies of a weight per graph: at least this many bytes read
TINYGEMM_MAX_ROWS = 32  # tinygemm's time grows with rows; past this it only wastes the run


def graph_us(calls: Sequence[Callable[[], object]], repeats: int = 20) -> float:
    """Device microseconds per call, each call of ``calls`` once per graph replay."""
    ms = graph_time_ms(lambda: [call() for call in calls], repeats, per_graph=1)
    return ms * 1000 / len(calls)


def tinygemm_weight(
    q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [K, N] 0..15, zeros / scales [K / G, N] -> (packed int4 for ``_weight_int4pack_mm``,
    scales_and_zeros [K / G, N, 2] bf16: ``w = (q - 8) * s + (8 - z) * s``)."""
    qn = q.t().contiguous().to(torch.int32)  # [N, K]
    bytes_ = ((qn[:, ::2] << 4) | qn[:, 1::2]).to(torch.uint8)  # [N, K / 2], even column high
    packed = torch.ops.aten._convert_weight_to_int4pack(bytes_, 8)
    s = scales.float()
    pairs = torch.stack([s, (8 - zeros.float()) * s], dim=-1).to(torch.bfloat16).contiguous()
    return packed, pairs


def error(y: torch.Tensor, reference: torch.Tensor) -> float:
    return float((y.double() - reference).abs().max() / reference.abs().max())


def candidates(n: int, k: int) -> dict[str, dict[str, Any]]:
    """Per candidate: ``make()`` a weight copy, ``run(w, x)``, the bytes it reads, the exact
    weight [N, K] float64 its values stand for, and the rows it is timed at (None: all)."""
    torch.manual_seed(0)
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02  # [N, K]
    q, zeros, scales = int4_groups(weight)  # [K, N], [K / G, N], [K / G, N] fp16
    gptq = QuantizedWeight("gptq", (n, k), pack_gptq_rows(q), scales, pack_sequential(zeros))
    exact4 = dequantize(gptq, torch.float64)
    fp8 = quantize_fp8(weight)
    exact8 = dequantize(fp8, torch.float64)
    found: dict[str, dict[str, Any]] = {
        "bf16": {"make": weight.clone, "run": lambda w, x: F.linear(x, w), "bytes": n * k * 2,
                 "reference": weight.double()},
        "int4-gemlite": {"make": lambda: Int4Gemm(_copy(gptq), torch.bfloat16),
                         "run": lambda w, x: w.packed_product(x), "bytes": gptq.nbytes, "reference": exact4},
        "int4-dense": {"make": lambda: Int4Gemm(_copy(gptq), torch.bfloat16, gemv=False),
                       "run": lambda w, x: w.dense_product(x), "bytes": gptq.nbytes, "reference": exact4},
        "fp8-gemlite": {"make": lambda: Fp8Gemm(_copy(fp8), torch.bfloat16),
                        "run": lambda w, x: w.packed_product(x), "bytes": fp8.nbytes, "reference": exact8},
        "fp8-scaled_mm": {"make": lambda: _copy(fp8), "run": lambda w, x: fp8_scaled_mm(x, w),
                          "bytes": fp8.nbytes, "reference": exact8},
    }  # fmt: skip
    packed, pairs = tinygemm_weight(q, zeros, scales)
    found["int4-tinygemm"] = {
        "make": lambda: (packed.clone(), pairs.clone()),
        "run": lambda w, x: torch.ops.aten._weight_int4pack_mm(x, w[0], GROUP_SIZE, w[1]),
        "bytes": n * k // 2 + pairs.numel() * 2,
        "reference": exact4,
        "max_rows": TINYGEMM_MAX_ROWS,
    }
    return found


def _copy(weight: QuantizedWeight) -> QuantizedWeight:
    def clone(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.clone()

    return QuantizedWeight(
        weight.kind, weight.shape, weight.qweight.clone(), weight.scales.clone(), clone(weight.qzeros),
        weight.perm, weight.zero_offset, weight.group_size,
    )  # fmt: skip


def run_case(entry: dict[str, Any], copies: list[Any], k: int, rows: int, bandwidth: float) -> dict[str, Any]:
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)  # [T, K]
    reference = x.double() @ entry["reference"].t()  # [T, N]
    err = error(entry["run"](copies[0], x), reference)
    us = graph_us([functools.partial(entry["run"], w, x) for w in copies])
    gb_s = entry["bytes"] / us / 1e3
    return {"us": round(us, 2), "gb_s": round(gb_s, 1), "of_copy": round(gb_s / bandwidth, 3), "error": err}


def main() -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--rows", default="1,2,4,8,16,32,64,128,512,2048")
    arguments.add_argument("--shape", default="llama3-8b")
    arguments.add_argument("--only", default="", help="comma-separated candidates (default: all)")
    args = arguments.parse_args()
    rows_list = [int(r) for r in args.rows.split(",")]
    only = set(filter(None, args.only.split(",")))
    bandwidth = copy_bandwidth_gb_s()
    results: dict[str, Any] = {"device": torch.cuda.get_device_name(), "copy_gb_s": round(bandwidth, 1),
                               "torch": torch.__version__, "cases": {}}  # fmt: skip
    print(f"{results['device']}: copy bandwidth {bandwidth:.0f} GB/s", flush=True)
    for projection, (n, k) in projection_shapes(args.shape).items():
        started = time.monotonic()
        found = {name: entry for name, entry in candidates(n, k).items() if not only or name in only}
        copies: dict[str, list[Any]] = {}
        for name, entry in found.items():
            try:
                count = max(1, math.ceil(L2_FLUSH_BYTES / entry["bytes"]))
                copies[name] = [entry["make"]() for _ in range(count)]
            except Exception as failure:  # a candidate that cannot be built is reported, not fatal
                print(f"  {name} unavailable: {type(failure).__name__}: {str(failure)[:300]}", flush=True)
        print(f"{projection} [{n} x {k}]", flush=True)
        for rows in rows_list:
            line = []
            for name, entry in found.items():
                if name not in copies or rows > entry.get("max_rows", rows):
                    continue
                try:
                    case = run_case(entry, copies[name], k, rows, bandwidth)
                except Exception as failure:  # one candidate's failure does not end the run
                    case = {"failed": f"{type(failure).__name__}: {str(failure)[:200]}"}
                results["cases"][f"{projection}/{rows}/{name}"] = case
                line.append(
                    f"{name} {case['us']:.1f}us {case['of_copy']:.0%} err {case['error']:.1e}"
                    if "us" in case
                    else f"{name} FAILED {case['failed']}"
                )
            print(f"  rows {rows:5d}: " + " | ".join(line), flush=True)
            write_results(args.json, results)
        del found, copies
        torch.cuda.empty_cache()
        print(f"  ({time.monotonic() - started:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
