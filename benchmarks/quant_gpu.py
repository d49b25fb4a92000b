"""Quantized bases on the GPU: decode speed against bf16, the dequantize-GEMM's bandwidth, FP8's error.

    python -m benchmarks.quant_gpu [--rounds 2] [--json OUT.json] [--sections decode,gemm,error]
    python -m benchmarks.quant_gpu --cpu   # a small smoke run on the CPU (SmolLM2-135M shape, FP8 only)

Random bf16 weights of the Llama-3-8B shape, quantized at load (``EngineConfig.quantization``:
FP8 per channel; AWQ and GPTQ 4-bit, group 128, round to nearest). What they are held to:

* decode: single-stream decode tok/s (base, 128-token prompt, 128 new tokens) and batch 32 with
  32 distinct rank-16 adapters on every projection, each quantization against bf16 (targets:
  FP8 >= 1.6x single / 1.4x batch; int4 >= 2.5x single / 1.5x batch);
* gemm: the dequantize-GEMM (``kernels/dequant_gemm.py``) and FP8 ``torch._scaled_mm`` at decode
  row counts on the 8B projections: time, GB/s over the bytes the weights need, and the
  fraction of the device's measured copy bandwidth (target for int4: >= 60%), with bf16
  ``F.linear`` beside it;
* error: FP8 against bf16 on the same random weights: prompt-token log-probabilities (max and
  mean absolute difference) and how often the argmax agrees.
"""

from __future__ import annotations

import functools
import gc
import logging
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.rounds import decode_tok_s, device_name, graph_time_ms, parser, random_prompts, write_results
from multilora_studio.bench.random_adapters import write_random_adapter
from multilora_studio.engine import Engine, EngineConfig, SamplingParams
from multilora_studio.engine.model.model_source import RANDOM_SHAPES
from multilora_studio.engine.model.quant_pack import quantize_awq, quantize_fp8, quantize_gptq
from multilora_studio.kernels.dequant_gemm import dequant_gemm
from multilora_studio.kernels.quant_linear import fp8_scaled_mm, scaled_mm_supported

QUANTIZATIONS = (None, "fp8", "awq", "gptq")


def engine_config(shape: str, device: str, quantization: str | None, batch: int) -> EngineConfig:
    return EngineConfig(
        model=f"random:{shape}",
        device=device,
        dtype="bfloat16" if device == "cuda" else "float32",
        quantization=quantization,
        max_loras=32,
        max_lora_rank=16,
        max_num_seqs=batch,
        max_model_len=512,
        max_num_batched_tokens=max(batch * 128, 256),
        kv_cache_memory_gb=8.0 if device == "cuda" else 0.25,
    )


def decode_section(
    shape: str, device: str, rounds: int, batch: int, new_tokens: int, kinds
) -> dict[str, Any]:
    """Single-stream and batch decode tok/s per quantization, and each one's ratio to bf16's."""
    spec = RANDOM_SHAPES[shape]
    folder = Path(tempfile.mkdtemp(prefix="quant-bench-"))
    names = [f"a{i}" for i in range(batch)]
    for i, name in enumerate(names):
        write_random_adapter(spec, folder / name, rank=16, seed=i, dtype=torch.bfloat16)
    generator = torch.Generator().manual_seed(0)
    results: dict[str, Any] = {}
    try:
        for quantization in kinds:
            label = quantization or "bf16"
            with Engine(engine_config(shape, device, quantization, batch)) as engine:
                for name in names:
                    engine.add_adapter(name, folder / name)
                engine.prefetch_adapters(names)
                prompts = random_prompts(batch, 128, spec.vocab_size, generator)
                params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
                engine.generate(prompts[:1], [None], params)  # warm-up
                single = [decode_tok_s(engine.generate(prompts[:1], [None], params)) for _ in range(rounds)]
                many = [decode_tok_s(engine.generate(prompts, names, params)) for _ in range(rounds)]
                weights = engine.runner.weights
                results[label] = {
                    "single_tok_s": statistics.median(single),
                    "batch_tok_s": statistics.median(many),
                    "quantization": None if weights.quantization is None else weights.quantization.label,
                }
            print(
                f"{label:5s} single {results[label]['single_tok_s']:8.1f} tok/s   batch {batch} x {batch} "
                f"adapters {results[label]['batch_tok_s']:8.1f} tok/s",
                flush=True,
            )
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if "bf16" in results:
        for label, row in results.items():
            row["single_vs_bf16"] = row["single_tok_s"] / results["bf16"]["single_tok_s"]
            row["batch_vs_bf16"] = row["batch_tok_s"] / results["bf16"]["batch_tok_s"]
            print(
                f"{label:5s} vs bf16: single {row['single_vs_bf16']:.2f}x  batch {row['batch_vs_bf16']:.2f}x"
            )
    return results


def copy_bandwidth_gb_s() -> float:
    """The device's streaming bandwidth (bytes read + written per second) of an elementwise
    kernel over 2 GiB (a copy_ inside a CUDA graph became a copy-engine node: 2.8 TB/s on the
    H200, below what the GEMMs reach)."""
    source = torch.empty(1 << 30, dtype=torch.int16, device="cuda")
    target = torch.empty_like(source)
    ms = graph_time_ms(lambda: torch.neg(source, out=target), 5, 2)
    return 2 * source.numel() * 2 / ms / 1e6


def projection_shapes(shape: str) -> dict[str, tuple[int, int]]:
    """[N, K] of each fused projection of a random shape's layer."""
    spec = RANDOM_SHAPES[shape]
    hidden, inter, q, kv = spec.hidden_size, spec.intermediate_size, spec.q_size, spec.kv_size
    return {
        "qkv": (q + 2 * kv, hidden),
        "o": (hidden, q),
        "gate_up": (2 * inter, hidden),
        "down": (hidden, inter),
    }


def gemm_section(shape: str) -> dict[str, Any]:
    """Each 8B projection at decode row counts: ms, GB/s and the fraction of the copy bandwidth."""
    shapes = projection_shapes(shape)
    peak = copy_bandwidth_gb_s()
    print(f"copy bandwidth {peak:.0f} GB/s", flush=True)
    rows_out: list[dict[str, Any]] = []
    generator = torch.Generator(device="cuda").manual_seed(0)
    for group, (n, k) in shapes.items():
        dense = (torch.randn(n, k, device="cuda", generator=generator) * k**-0.5).to(torch.bfloat16)
        weights = {"awq": quantize_awq(dense), "gptq": quantize_gptq(dense), "fp8": quantize_fp8(dense)}
        for rows in (1, 8, 16, 32):
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            io_bytes = 2 * rows * (k + n)
            cases = {"bf16": (functools.partial(F.linear, x, dense), dense.numel() * 2)}
            for kind, weight in weights.items():
                cases[f"{kind} triton"] = (functools.partial(dequant_gemm, x, weight), weight.nbytes)
            if scaled_mm_supported(torch.device("cuda"), torch.bfloat16):
                fp8 = weights["fp8"]
                cases["fp8 scaled_mm"] = (functools.partial(fp8_scaled_mm, x, fp8), fp8.nbytes)
            for label, (fn, weight_bytes) in cases.items():
                ms = graph_time_ms(fn)
                gb_s = (weight_bytes + io_bytes) / ms / 1e6
                row = {
                    "group": group,
                    "rows": rows,
                    "path": label,
                    "ms": ms,
                    "gb_s": gb_s,
                    "of_copy": gb_s / peak,
                }
                rows_out.append(row)
                print(f"{group:8s} [{n:5d},{k:5d}] rows {rows:2d} {label:14s} {ms * 1e3:8.1f} us "
                      f"{gb_s:7.0f} GB/s  {gb_s / peak:5.0%} of copy", flush=True)  # fmt: skip
        torch.cuda.empty_cache()
    return {"copy_gb_s": peak, "rows": rows_out}


def error_section(shape: str, device: str) -> dict[str, Any]:
    """FP8 (quantized at load) against bf16 on the same random weights: prompt log-probabilities."""
    generator = torch.Generator().manual_seed(1)
    prompts = random_prompts(8, 64, RANDOM_SHAPES[shape].vocab_size, generator)
    scored = {}
    for quantization in (None, "fp8"):
        with Engine(engine_config(shape, device, quantization, 8)) as engine:
            scored[quantization] = engine.score(prompts, None, top_k=1)
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    diffs, agree, total = [], 0, 0
    for plain, fp8 in zip(scored[None], scored["fp8"], strict=True):
        for a, b in zip(plain.prompt_logprobs or (), fp8.prompt_logprobs or (), strict=True):
            if a is None or b is None:  # the first prompt token is not scored
                continue
            diffs.append(abs(a.logprob - b.logprob))
            agree += int(a.top[0][0] == b.top[0][0])  # (token id, log-probability) pairs
            total += 1
    result = {
        "max_abs_logprob": max(diffs),
        "mean_abs_logprob": statistics.fmean(diffs),
        "argmax_agreement": agree / total,
    }
    print(
        f"fp8 vs bf16 log-probabilities: max |diff| {result['max_abs_logprob']:.4f}, mean "
        f"{result['mean_abs_logprob']:.4f}, argmax agrees {result['argmax_agreement']:.1%} of {total}"
    )
    return result


def main() -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--cpu", action="store_true", help="small smoke run on the CPU")
    arguments.add_argument("--sections", default="decode,gemm,error", help="which sections to run")
    args = arguments.parse_args()
    logging.basicConfig(level=logging.WARNING)
    sections = set(args.sections.split(","))
    shape, device = ("smollm2-135m", "cpu") if args.cpu else ("llama3-8b", "cuda")
    results: dict[str, Any] = {"device": device_name(device), "shape": shape}
    if "decode" in sections:
        kinds = (None, "fp8") if args.cpu else QUANTIZATIONS  # 135M's hidden size is no multiple of 128
        batch, new_tokens = (4, 8) if args.cpu else (32, 128)
        results["decode"] = decode_section(shape, device, args.rounds, batch, new_tokens, kinds)
    if "gemm" in sections and device == "cuda":
        results["gemm"] = gemm_section(shape)
    if "error" in sections:
        results["error"] = error_section(shape, device)
    write_results(args.json, results)


if __name__ == "__main__":
    main()
