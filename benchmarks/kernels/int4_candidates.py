"""Weight-only 4-bit and FP8 GEMMs side by side on the Llama-3-8B projections: which kernel to stand on.

    python -m benchmarks.kernels.int4_candidates [--rows 1,8,16,32,128,2048] [--json OUT.json]

One random bf16 weight per projection, quantized round-to-nearest in groups of 128
(``quant_pack.int4_groups``); every candidate gets the same 4-bit values:

* ``bf16``: ``F.linear`` on the float weight, the baseline;
* ``engine``: the engine's dequantize-GEMM (``kernels/dequant_gemm.py``) on AWQ's layout;
* ``tinygemm``: PyTorch's ``aten._weight_int4pack_mm`` (torchao's int4 weight-only path on
  CUDA), scales and zeros as bf16 pairs ``w = (q - 8) * s + z'`` with ``z' = (8 - z) * s``;
* ``gemlite-bf16`` / ``gemlite-fp16``: gemlite's A16W4 (Triton GEMV / split-K / GEMM, its H100
  launch table loaded, autotuned where a case is missing), activations in bf16 or fp16;
* ``fp8``: ``torch._scaled_mm`` with per-row activation and per-channel weight scales (the
  engine's FP8 path) on the same float weight.

Each case is timed inside one CUDA graph that runs the GEMM over enough copies of the weight to
exceed the L2 cache (as a model's layers do), so the figures are what a decode step sees. Printed
per case: microseconds, GB/s over the weight bytes, the fraction of copy bandwidth, and the error
against float64 over the exact dequantized weight (max absolute difference over the reference's
largest magnitude); per candidate, how far its stored weight is from the exact one (bf16 scales
round AWQ's fp16 ones).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.quant_gpu import copy_bandwidth_gb_s, projection_shapes
from benchmarks.rounds import parser, write_results
from multilora_studio.engine.model.quant_pack import int4_groups, pack_awq, quantize_fp8
from multilora_studio.kernels.dequant_gemm import dequant_gemm
from multilora_studio.kernels.quant_linear import fp8_scaled_mm
from multilora_studio.kernels.quant_weight import GROUP_SIZE, QuantizedWeight

L2_FLUSH_BYTES = 256 * 2**20  # copies of a weight per graph: at least this many bytes read


def graph_us(calls: Sequence[Callable[[], object]], repeats: int = 20) -> float:
    """Device microseconds per call, each call of ``calls`` once per graph replay."""
    for call in calls:  # launches compiled and autotuned before the capture
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (repeats * len(calls))


def tinygemm_weight(
    q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [K, N] 0..15, zeros / scales [K / G, N] -> (packed int4 for ``_weight_int4pack_mm``,
    scales_and_zeros [K / G, N, 2] bf16)."""
    qn = q.t().contiguous().to(torch.int32)  # [N, K]
    bytes_ = ((qn[:, ::2] << 4) | qn[:, 1::2]).to(torch.uint8)  # [N, K / 2], even column high
    packed = torch.ops.aten._convert_weight_to_int4pack(bytes_, 8)
    s = scales.float()
    z = (8 - zeros.float()) * s  # [K / G, N]
    pairs = torch.stack([s, z], dim=-1).to(torch.bfloat16).contiguous()  # [K / G, N, 2]
    return packed, pairs


def tinygemm_dequantized(q: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    """What tinygemm computes with: [N, K] float64."""
    s = pairs[..., 0].double().repeat_interleave(GROUP_SIZE, 0)  # [K, N]
    z = pairs[..., 1].double().repeat_interleave(GROUP_SIZE, 0)
    return ((q.double() - 8) * s + z).t()


def gemlite_layer(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype):
    """gemlite's A16W4 over q [K, N], zeros / scales [K / G, N] (its HQQ layout: [N, K] values,
    [N, K / G] scales and zeros)."""
    from gemlite.helper import A16W4_HQQ_INT

    return A16W4_HQQ_INT(device="cuda", dtype=dtype).from_weights(
        q.t().contiguous().to(torch.uint8),
        scales.t().contiguous().to(dtype),
        zeros.t().contiguous().to(dtype),
    )


def error(y: torch.Tensor, reference: torch.Tensor) -> float:
    return float((y.double() - reference).abs().max() / reference.abs().max())


def candidates(n: int, k: int) -> dict[str, dict[str, Any]]:
    """Per candidate: ``run(x)``, the weight bytes it reads, its stored weight's error, the
    activation dtype, one call per weight copy."""
    torch.manual_seed(0)
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02  # [N, K]
    q, zeros, scales = int4_groups(weight)  # [K, N], [K / G, N], [K / G, N] fp16
    exact = (
        (q.double() - zeros.double().repeat_interleave(GROUP_SIZE, 0))
        * scales.double().repeat_interleave(GROUP_SIZE, 0)
    ).t()  # [N, K]
    int4_bytes = n * k // 2 + scales.numel() * 2 + zeros.numel() // 2
    found: dict[str, dict[str, Any]] = {}
    found["bf16"] = {
        "make": weight.clone,
        "run": lambda w, x: F.linear(x, w),
        "bytes": n * k * 2,
        "reference": weight.double(),
        "dtype": torch.bfloat16,
    }
    awq = QuantizedWeight("awq", (n, k), pack_awq(q), scales.half(), pack_awq(zeros))
    found["engine"] = {
        "make": lambda: _copy_quantized(awq),
        "run": lambda w, x: dequant_gemm(x, w),
        "bytes": int4_bytes,
        "reference": exact,
        "dtype": torch.bfloat16,
    }
    try:
        packed, pairs = tinygemm_weight(q, zeros, scales)
        found["tinygemm"] = {
            "make": lambda: (packed.clone(), pairs.clone()),
            "run": lambda w, x: torch.ops.aten._weight_int4pack_mm(x, w[0], GROUP_SIZE, w[1]),
            "bytes": n * k // 2 + pairs.numel() * 2,
            "reference": tinygemm_dequantized(q, pairs),
            "dtype": torch.bfloat16,
        }
    except Exception as failure:  # an op this build lacks is reported, not fatal
        print(f"  tinygemm unavailable: {type(failure).__name__}: {str(failure)[:160]}", flush=True)
    for dtype, label in ((torch.bfloat16, "gemlite-bf16"), (torch.float16, "gemlite-fp16")):
        try:
            layer = gemlite_layer(q, zeros, scales, dtype)
            rounded_s = scales.to(dtype).double().repeat_interleave(GROUP_SIZE, 0)
            rounded_z = zeros.to(dtype).double().repeat_interleave(GROUP_SIZE, 0)
            found[label] = {
                "make": functools.partial(gemlite_layer, q, zeros, scales, dtype),
                "run": lambda w, x: w(x),
                "bytes": int4_bytes,
                "reference": ((q.double() - rounded_z) * rounded_s).t(),
                "dtype": dtype,
                "first": layer,
            }
        except Exception as failure:  # a missing or failing library is reported, not fatal
            print(f"  {label} unavailable: {type(failure).__name__}: {str(failure)[:160]}", flush=True)
    fp8 = quantize_fp8(weight)
    found["fp8"] = {
        "make": lambda: _copy_quantized(fp8),
        "run": lambda w, x: fp8_scaled_mm(x, w),
        "bytes": n * k + n * 4,
        "reference": fp8.qweight.double() * fp8.scales.double().unsqueeze(1),
        "dtype": torch.bfloat16,
    }
    for entry in found.values():
        entry["weight_error"] = float((entry["reference"] - exact).abs().max() / exact.abs().max())
    return found


def _copy_quantized(weight: QuantizedWeight) -> QuantizedWeight:
    return QuantizedWeight(
        weight.kind,
        weight.shape,
        weight.qweight.clone(),
        weight.scales.clone(),
        None if weight.qzeros is None else weight.qzeros.clone(),
        weight.perm,
        weight.zero_offset,
        weight.group_size,
    )


def weight_copies(entry: dict[str, Any]) -> list[Any]:
    """Enough copies of a candidate's weight to read past the L2 cache in one graph."""
    first = entry.get("first") or entry["make"]()
    count = max(1, math.ceil(L2_FLUSH_BYTES / entry["bytes"]))
    return [first] + [entry["make"]() for _ in range(count - 1)]


def run_case(entry: dict[str, Any], copies: list[Any], k: int, rows: int, bandwidth: float) -> dict[str, Any]:
    x = torch.randn(rows, k, device="cuda", dtype=entry["dtype"])  # [T, K]
    reference = x.double() @ entry["reference"].t()  # [T, N]
    err = error(entry["run"](copies[0], x), reference)
    calls = [functools.partial(entry["run"], w, x) for w in copies]
    us = graph_us(calls)
    gb_s = entry["bytes"] / us / 1e3
    return {"us": round(us, 2), "gb_s": round(gb_s, 1), "of_copy": round(gb_s / bandwidth, 3), "error": err}


def main() -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--rows", default="1,8,16,32,128,2048")
    arguments.add_argument("--shape", default="llama3-8b")
    args = arguments.parse_args()
    rows_list = [int(r) for r in args.rows.split(",")]
    try:
        import gemlite

        config = Path(gemlite.__file__).parent / "configs" / "h100.json"
        gemlite.load_config(str(config))
        print(f"gemlite {gemlite.__version__}, launch table {config.name}", flush=True)
    except ImportError:
        print("gemlite not installed", flush=True)
    bandwidth = copy_bandwidth_gb_s()
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "copy_gb_s": round(bandwidth, 1),
        "torch": torch.__version__,
        "cases": {},
    }
    print(f"{results['device']}: copy bandwidth {bandwidth:.0f} GB/s", flush=True)
    for projection, (n, k) in projection_shapes(args.shape).items():
        started = time.monotonic()
        found = candidates(n, k)
        print(
            f"{projection} [{n} x {k}]: stored-weight error "
            + ", ".join(f"{name} {entry['weight_error']:.1e}" for name, entry in found.items()),
            flush=True,
        )
        copies = {name: weight_copies(entry) for name, entry in found.items()}
        for rows in rows_list:
            line = []
            for name, entry in found.items():
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
