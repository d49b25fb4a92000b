"""Two 8B-shaped base models in one process: colocated throughput, and a time-share swap.

    python -m benchmarks.bases_gpu [--rounds 3] [--kv-cache-gb 8] [--json PATH]

Colocated: a BasePool with a random Llama-3-8B and a random Qwen3-8B base (bf16, CUDA graphs),
each with 32 distinct rank-16 adapters on all seven projections; batch 32 (128-token prompts,
64 new greedy tokens, one adapter a row) on each base alone, then on both at once from two
threads (alternating traffic), decode tok/s medians; each base's share is its concurrent
rate over its alone rate.

Swap: a pool of the Llama-3-8B shape written to disk as a checkpoint folder and the random
Qwen3-8B, with room for one; the time a request for the swapped-out base waits for it
(unloading the other, loading it: ``BasePool.acquire``), against the copy time of its weight
bytes at the measured pinned host-to-device bandwidth.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch

from benchmarks.engine_gpu import run_batch
from benchmarks.merge_gpu import write_random_base
from benchmarks.rounds import parser, report_json
from multilora_studio.bench.random_adapters import write_random_adapter
from multilora_studio.deploy import BasePool
from multilora_studio.engine import EngineConfig
from multilora_studio.engine.model.model_source import RANDOM_SHAPES

SHAPES = ("llama3-8b", "qwen3-8b")
BATCH = 32


def pinned_upload_bandwidth(size_bytes: int = 2 << 30) -> float:
    """Bytes/s of a page-locked host buffer copied to the device (best of five)."""
    host = torch.empty(size_bytes, dtype=torch.uint8).pin_memory()
    device = torch.empty(size_bytes, dtype=torch.uint8, device="cuda")
    best = float("inf")
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        device.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return size_bytes / best


def settings(model: str, kv_cache_gb: float) -> EngineConfig:
    return EngineConfig(
        model=model, device="cuda", dtype="bfloat16", max_loras=BATCH, max_cpu_loras=BATCH,
        max_lora_rank=16, max_num_seqs=BATCH, max_model_len=256, max_num_batched_tokens=4096,
        kv_cache_memory_gb=kv_cache_gb,
    )  # fmt: skip


def colocated(args: argparse.Namespace, workdir: Path) -> dict:
    pool = BasePool([settings(f"random:{shape}", args.kv_cache_gb) for shape in SHAPES])
    generator = torch.Generator().manual_seed(0)
    work = {}
    with pool:
        for shape, base in zip(SHAPES, pool.names, strict=True):
            spec = RANDOM_SHAPES[shape]
            names = []
            for i in range(BATCH):
                folder = write_random_adapter(
                    spec, workdir / f"{shape}-{i}", 16, seed=i, dtype=torch.bfloat16
                )
                pool.add_adapter(base, f"{shape}-{i}", folder, preload=False)
                names.append(f"{shape}-{i}")
            prompts = [torch.randint(0, spec.vocab_size, (128,), generator=generator).tolist() for _ in names]
            work[base] = (prompts, names)

        def one(base: str, new_tokens: int = 64) -> float:
            prompts, names = work[base]
            with pool.lease(base) as engine:
                return run_batch(engine, prompts, names, new_tokens)["decode_tok_s"]

        for base in pool.names:
            one(base, 8)  # warm-up: slots filled, graphs of the per-row buckets
        alone: dict[str, list[float]] = {base: [] for base in pool.names}
        together: dict[str, list[float]] = {base: [] for base in pool.names}
        for _ in range(args.rounds):
            for base in pool.names:
                alone[base].append(one(base))
            rates: dict[str, float] = {}

            def measure(base: str, into: dict[str, float] = rates) -> None:
                into[base] = one(base)

            threads = [threading.Thread(target=measure, args=(b,)) for b in pool.names]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            for base, rate in rates.items():
                together[base].append(rate)
        return {
            base: {
                "alone_decode_tok_s": round(statistics.median(alone[base]), 1),
                "together_decode_tok_s": round(statistics.median(together[base]), 1),
                "share": round(statistics.median(together[base]) / statistics.median(alone[base]), 3),
                "rounds_alone": [round(v, 1) for v in alone[base]],
                "rounds_together": [round(v, 1) for v in together[base]],
            }
            for base in pool.names
        }


def swap(args: argparse.Namespace, workdir: Path) -> dict:
    folder = workdir / "llama3-8b-base"
    write_random_base(RANDOM_SHAPES["llama3-8b"], folder, "cuda")
    weight_bytes = sum(path.stat().st_size for path in folder.glob("*.safetensors"))
    bandwidth = pinned_upload_bandwidth()
    configs = [settings(str(folder), args.kv_cache_gb), settings("random:qwen3-8b", args.kv_cache_gb)]
    waits: dict[str, list[float]] = {}
    with BasePool(configs, max_resident=1) as pool:
        for _ in range(args.rounds + 1):
            for base in pool.names:
                started = time.perf_counter()
                pool.acquire(base)
                waits.setdefault(base, []).append(time.perf_counter() - started)
                pool.release(base)
    folder_base = pool.names[0]
    loads = waits[folder_base][1:]  # the first is the cold start (Triton compiles, first page-in)
    copy_s = weight_bytes / bandwidth
    return {
        "weight_GB": round(weight_bytes / 1e9, 2),
        "pinned_h2d_GBps": round(bandwidth / 1e9, 1),
        "copy_time_s": round(copy_s, 3),
        "swap_in_s": [round(v, 2) for v in loads],
        "swap_in_median_s": round(statistics.median(loads), 2),
        "over_copy_time": round(statistics.median(loads) / copy_s, 1),
        "other_base_swap_in_s": [round(v, 2) for v in waits[pool.names[1]][1:]],
    }


def main() -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--kv-cache-gb", type=float, default=8.0)
    arguments.add_argument("--skip-swap", action="store_true")
    args = arguments.parse_args()
    logging.basicConfig(level=logging.INFO)
    workdir = Path(tempfile.mkdtemp(prefix="mls-bases-bench-"))
    results: dict = {"gpu": torch.cuda.get_device_name(), "colocated": colocated(args, workdir)}
    report_json(results)
    if not args.skip_swap:
        results["swap"] = swap(args, workdir)
    report_json(results, args.json)


if __name__ == "__main__":
    main()
