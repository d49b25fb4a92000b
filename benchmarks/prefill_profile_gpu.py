"""Where a prefill's GPU time goes with and without adapters: kernels from a torch profile.

    python -m benchmarks.prefill_profile_gpu [--json PATH]

An engine as ``multilora-studio bench latency`` starts it (random Llama-3-8B shape, bf16, 32
slots of rank-16 adapters on all seven projections, 4,096-token steps). Profiled after a
warm-up: one 2,048-token prompt (one output token) on the base and on one adapter, and 16
prompts of 1,024 tokens on the base and over four adapters. For each run: wall seconds, the
GPU time summed over kernels, and the kernels by GPU time; then the kernels whose time grew
most with adapters.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from multilora_studio.bench.random_adapters import write_random_adapter
from multilora_studio.engine import Engine, EngineConfig, SamplingParams
from multilora_studio.engine.model.model_source import RANDOM_SHAPES

ONE = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)


def kernel_times(prof: Any) -> dict[str, float]:
    """GPU milliseconds per kernel name (summed over launches)."""
    totals: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        us = getattr(event, "self_device_time_total", None)
        if us is None:
            us = getattr(event, "self_cuda_time_total", 0.0)
        if us and str(getattr(event, "device_type", "")).endswith("CUDA"):
            totals[event.key[:90]] += us / 1e3
    return dict(totals)


def profiled(engine: Engine, prompts: list[list[int]], adapters: list[str | None]) -> dict[str, Any]:
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        engine.generate(prompts, adapters, ONE)
        wall = time.perf_counter() - start
    kernels = kernel_times(prof)
    return {"wall_ms": 1e3 * wall, "gpu_ms": sum(kernels.values()), "kernels": kernels}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    spec = RANDOM_SHAPES["llama3-8b"]
    workdir = Path(tempfile.mkdtemp(prefix="mls-prefill-profile-"))
    config = EngineConfig(
        model="random:llama3-8b", device="cuda", dtype="bfloat16", max_loras=32, max_lora_rank=16,
        max_num_seqs=32, max_model_len=2048 + 64, max_num_batched_tokens=4096,
    )  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    long_prompt = torch.randint(0, spec.vocab_size, (2048,), generator=generator).tolist()
    prefill = [torch.randint(0, spec.vocab_size, (1024,), generator=generator).tolist() for _ in range(16)]
    results: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "runs": {}}
    with Engine(config) as engine:
        names = []
        for i in range(4):
            folder = write_random_adapter(spec, workdir / f"a{i}", 16, seed=i, dtype=torch.bfloat16)
            engine.add_adapter(f"a{i}", folder)
            names.append(f"a{i}")
        runs: dict[str, tuple[list[list[int]], list[str | None]]] = {
            "ttft_base": ([long_prompt], [None]),
            "ttft_adapter": ([long_prompt], [names[0]]),
            "prefill_base": (prefill, [None] * 16),
            "prefill_4_adapters": (prefill, [names[i % 4] for i in range(16)]),
        }
        for prompts, adapters in runs.values():  # warm-up: slots filled, kernels compiled
            engine.generate(prompts, adapters, ONE)
            engine.generate(prompts, adapters, ONE)
        for name, (prompts, adapters) in runs.items():
            results["runs"][name] = profiled(engine, prompts, adapters)
    for base, lora in (("ttft_base", "ttft_adapter"), ("prefill_base", "prefill_4_adapters")):
        a, b = results["runs"][base], results["runs"][lora]
        grown = {
            key: b["kernels"].get(key, 0.0) - a["kernels"].get(key, 0.0)
            for key in set(a["kernels"]) | set(b["kernels"])
        }
        top = sorted(grown.items(), key=lambda kv: -abs(kv[1]))[:14]
        results[f"{lora}_grown_ms"] = dict(top)
        print(
            f"{base}: wall {a['wall_ms']:.1f} ms, GPU {a['gpu_ms']:.1f} ms | "
            f"{lora}: wall {b['wall_ms']:.1f} ms, "
            f"GPU {b['gpu_ms']:.1f} ms"
        )
        for key, ms in top:
            print(f"  {ms:+8.2f} ms  {b['kernels'].get(key, 0.0):8.2f}  {key}")
    for name, run in results["runs"].items():
        print(f"{name}: top kernels")
        for key, ms in sorted(run["kernels"].items(), key=lambda kv: -kv[1])[:10]:
            print(f"  {ms:8.2f} ms  {key}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
