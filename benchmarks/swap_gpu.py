"""Time-share swap of an 8B-shaped base from host memory, against a plain copy of its bytes.

    python -m benchmarks.swap_gpu [--model random:llama3-8b] [--rounds 3] [--json PATH]

Engine: a ``random:llama3-8b`` engine (bf16, CUDA graphs, 8 slots holding rank-16 adapters on
all seven projections) is parked (``Engine.park``: weights and slots to page-locked host memory)
and swapped back in (``Engine.unpark``) ``--rounds`` times; each swap-in's seconds against one
plain page-locked host-to-device copy of the same bytes (best of five, ``cudaHostRegister``
memory as the park uses), and their ratio (the target: <= 2). The first swap-out
page-locks the host buffer; later ones only copy. Also: the first request after a swap-in
(its graphs are captured again then) against the same request warm, and whether the tokens
after a swap-in equal those before.

Pool: a ``BasePool`` of the same shape and ``random:qwen3-8b`` with room for one; the wait of a
request for the swapped-out base (``BasePool.acquire``: the other parked, this one swapped in).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.rounds import parser, report_json
from multilora_studio.bench.random_adapters import write_random_adapter
from multilora_studio.deploy import BasePool
from multilora_studio.engine import Engine, EngineConfig, SamplingParams
from multilora_studio.engine.model.model_source import RANDOM_SHAPES
from multilora_studio.engine.residency.device_parking import DeviceParking, HostBuffer, tensors_of

SLOTS = 8
PROMPTS = [[1, *range(100, 228)] for _ in range(SLOTS)]  # 129 tokens each
PARAMS = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


def settings(model: str) -> EngineConfig:
    return EngineConfig(
        model=model, device="cuda", dtype="bfloat16", max_loras=SLOTS, max_cpu_loras=SLOTS,
        max_lora_rank=16, max_num_seqs=32, max_model_len=1024, kv_cache_memory_gb=4.0,
    )  # fmt: skip


def plain_copy_seconds(nbytes: int) -> float:
    """Seconds of one page-locked host-to-device copy of ``nbytes`` (best of five)."""
    host = HostBuffer(nbytes, pin=True)
    try:
        assert host.pinned, "could not page-lock the host buffer"
        device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        best = float("inf")
        for _ in range(5):
            torch.cuda.synchronize()
            start = time.perf_counter()
            device.copy_(host.memory, non_blocking=True)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - start)
        del device
        torch.cuda.empty_cache()
        return best
    finally:
        host.close()


def timed(work: Callable[[], object]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def engine_swaps(args: argparse.Namespace, workdir: Path) -> dict:
    spec = RANDOM_SHAPES[args.model.removeprefix("random:")]
    with Engine(settings(args.model)) as engine:
        names = []
        for i in range(SLOTS):
            folder = write_random_adapter(spec, workdir / f"adapter-{i}", 16, seed=i, dtype=torch.bfloat16)
            engine.add_adapter(f"adapter-{i}", folder)
            names.append(f"adapter-{i}")
        # the first batch fills the slots (requests join as their uploads land), so the tokens to
        # compare with come from the second, which runs whole in every step as later batches do
        cold = [o.token_ids for o in engine.generate(PROMPTS, names, PARAMS)]
        before = [o.token_ids for o in engine.generate(PROMPTS, names, PARAMS)]
        weights = DeviceParking.kept_bytes(tensors_of(engine.runner.weights))  # each storage once
        nbytes = engine.park_bytes()
        outs, ins, first, warm = [], [], [], []
        equal = True
        for _ in range(args.rounds):
            outs.append(timed(engine.park))
            ins.append(timed(engine.unpark))
            first.append(timed(lambda: engine.generate(PROMPTS, names, PARAMS)))  # graphs captured again
            warm.append(timed(lambda: engine.generate(PROMPTS, names, PARAMS)))
            equal = equal and [o.token_ids for o in engine.generate(PROMPTS, names, PARAMS)] == before
    copy_s = plain_copy_seconds(nbytes)
    swap_in = statistics.median(ins)
    return {
        "model": args.model,
        "weights_GB": round(weights / 1e9, 3),
        "parked_GB": round(nbytes / 1e9, 3),  # weights and the slots
        "plain_pinned_copy_s": round(copy_s, 4),
        "plain_pinned_h2d_GBps": round(nbytes / copy_s / 1e9, 1),
        "swap_in_s": [round(v, 4) for v in ins],
        "swap_in_median_s": round(swap_in, 4),
        "swap_in_over_copy": round(swap_in / copy_s, 2),  # target <= 2
        "swap_out_s": [round(v, 3) for v in outs],  # the first page-locks the host buffer
        "first_batch_after_swap_in_s": [round(v, 3) for v in first],
        "warm_batch_s": [round(v, 3) for v in warm],
        "tokens_equal_after_swaps": equal,
        "first_batch_tokens_equal_warm": cold == before,
    }


def pool_swaps(args: argparse.Namespace) -> dict:
    configs = [settings(args.model), settings("random:qwen3-8b")]
    waits: dict[str, list[float]] = {}
    with BasePool(configs, max_resident=1) as pool:
        for _ in range(args.rounds + 1):
            for base in pool.names:
                started = time.perf_counter()
                engine = pool.acquire(base)
                waits.setdefault(base, []).append(time.perf_counter() - started)
                try:
                    engine.generate(PROMPTS[:1], [None], PARAMS)
                finally:
                    pool.release(base)
        starts = {name: pool.base(name).starts for name in pool.names}
    first = pool.names[0]
    return {
        "swap_wait_s": [round(v, 3) for v in waits[first][1:]],  # the first is the cold start
        "swap_wait_median_s": round(statistics.median(waits[first][1:]), 3),
        "other_base_swap_wait_s": [round(v, 3) for v in waits[pool.names[1]][1:]],
        "engine_starts": starts,  # 1 each: swaps parked, never restarted
    }


def main() -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--model", default="random:llama3-8b")
    arguments.add_argument("--skip-pool", action="store_true")
    args = arguments.parse_args()
    logging.basicConfig(level=logging.INFO)
    workdir = Path(tempfile.mkdtemp(prefix="mls-swap-bench-"))
    results: dict = {"gpu": torch.cuda.get_device_name(), "engine": engine_swaps(args, workdir)}
    report_json(results)
    if not args.skip_pool:
        results["pool"] = pool_swaps(args)
    report_json(results, args.json)


if __name__ == "__main__":
    main()
