"""Quantized bases on the GPU against bf16: decode, prefill and the logits' error, in one run.

    python -m benchmarks.quant_gpu [--rounds 2] [--json OUT.json] [--sections decode,prefill,error]
    python -m benchmarks.quant_gpu --cpu   # a small smoke run on the CPU (SmolLM2-135M shape, FP8 only)

Random bf16 weights of the Llama-3-8B shape, quantized at load (``EngineConfig.quantization``:
FP8 per channel; AWQ and GPTQ 4-bit, group 128, round to nearest), one engine after the other.
What they are held to (ratios against bf16 in the same run):

* decode: single-stream tok/s (base, 128-token prompt, 128 new tokens; FP8 >= 1.6x, 4-bit
  >= 2.5x), batch 32 with 32 distinct rank-16 adapters on every projection (FP8 >= 1.4x, 4-bit
  >= 1.8x), and batch 32 of the base alone (32 adapters >= 0.85 of it);
* prefill: 16 prompts x 1,024 tokens, one new token each: prompt tokens/s (>= 0.8 of bf16);
* error: each format's next-token distributions against bf16's on the same random weights
  (64 prompts of 64 tokens, the last position of each): mean KL(bf16 || format) in nats and
  top-1 agreement.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.rounds import decode_tok_s, device_name, graph_time_ms, parser, random_prompts, write_results
from multilora_studio.bench.random_adapters import write_random_adapter
from multilora_studio.engine import Engine, EngineConfig, SamplingParams
from multilora_studio.engine.model.model_source import RANDOM_SHAPES
from multilora_studio.engine.step.next_token_logits import next_token_logits
from multilora_studio.evaluate.quant_drift import compare


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
                alone = [
                    decode_tok_s(engine.generate(prompts, [None] * batch, params)) for _ in range(rounds)
                ]
                weights = engine.runner.weights
                results[label] = {
                    "single_tok_s": statistics.median(single),
                    "batch_tok_s": statistics.median(many),
                    "batch_base_tok_s": statistics.median(alone),
                    "quantization": None if weights.quantization is None else weights.quantization.label,
                }
            row = results[label]
            row["adapters_vs_base"] = row["batch_tok_s"] / row["batch_base_tok_s"]
            print(
                f"{label:5s} single {row['single_tok_s']:8.1f} tok/s   batch {batch} x {batch} adapters "
                f"{row['batch_tok_s']:8.1f} tok/s   base alone {row['batch_base_tok_s']:8.1f} tok/s "
                f"(adapters {row['adapters_vs_base']:.2f} of it)",
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


def prefill_section(
    shape: str, device: str, rounds: int, prompts_n: int, length: int, kinds
) -> dict[str, Any]:
    """Prompt tokens/s of ``prompts_n`` prompts x ``length`` tokens sent at once (one new token each)."""
    spec = RANDOM_SHAPES[shape]
    generator = torch.Generator().manual_seed(2)
    results: dict[str, Any] = {}
    for quantization in kinds:
        label = quantization or "bf16"
        config = dataclasses.replace(
            engine_config(shape, device, quantization, prompts_n),
            max_model_len=length + 8, max_num_batched_tokens=prompts_n * length,
        )  # fmt: skip
        with Engine(config) as engine:
            params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
            engine.generate(random_prompts(prompts_n, length, spec.vocab_size, generator), None, params)
            times = []
            for _ in range(rounds):
                prompts = random_prompts(prompts_n, length, spec.vocab_size, generator)
                started = time.perf_counter()
                engine.generate(prompts, None, params)
                times.append(time.perf_counter() - started)
        results[label] = {"prompt_tok_s": prompts_n * length / statistics.median(times)}
        print(
            f"{label:5s} prefill {prompts_n} x {length}: {results[label]['prompt_tok_s']:9.0f} prompt tok/s",
            flush=True,
        )
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    if "bf16" in results:
        for label, row in results.items():
            row["vs_bf16"] = row["prompt_tok_s"] / results["bf16"]["prompt_tok_s"]
            print(f"{label:5s} prefill vs bf16: {row['vs_bf16']:.2f}x")
    return results


def error_section(shape: str, device: str, kinds) -> dict[str, Any]:
    """Each format's next-token distributions against bf16's on the same random weights."""
    generator = torch.Generator().manual_seed(1)
    prompts = random_prompts(64, 64, RANDOM_SHAPES[shape].vocab_size, generator)
    logits = {}
    for quantization in kinds:
        logits[quantization] = next_token_logits(engine_config(shape, device, quantization, 16), prompts)
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    results: dict[str, Any] = {}
    for quantization in kinds:
        if quantization is None:
            continue
        drift = compare(logits[None], logits[quantization])
        results[quantization] = {"mean_kl": drift.mean_kl, "top1_agreement": drift.top1_agreement}
        print(f"{quantization:5s} vs bf16: {drift.describe()}", flush=True)
    return results


def main() -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--cpu", action="store_true", help="small smoke run on the CPU")
    arguments.add_argument("--sections", default="decode,prefill,error", help="which sections to run")
    arguments.add_argument("--formats", default="fp8,awq,gptq", help="the quantizations beside bf16")
    args = arguments.parse_args()
    logging.basicConfig(level=logging.WARNING)
    sections = set(args.sections.split(","))
    shape, device = ("smollm2-135m", "cpu") if args.cpu else ("llama3-8b", "cuda")
    results: dict[str, Any] = {"device": device_name(device), "shape": shape}
    kinds = (None, "fp8") if args.cpu else (None, *args.formats.split(","))  # 135M: hidden size 576
    if "decode" in sections:
        batch, new_tokens = (4, 8) if args.cpu else (32, 128)
        results["decode"] = decode_section(shape, device, args.rounds, batch, new_tokens, kinds)
        write_results(args.json, results)
    if "prefill" in sections:
        prompts_n, length = (2, 128) if args.cpu else (16, 1024)
        results["prefill"] = prefill_section(shape, device, args.rounds, prompts_n, length, kinds)
        write_results(args.json, results)
    if "error" in sections:
        results["error"] = error_section(shape, device, kinds)
    write_results(args.json, results)


if __name__ == "__main__":
    main()
