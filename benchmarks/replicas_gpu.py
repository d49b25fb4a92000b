"""Two engine replicas sharing one GPU behind the dispatcher, against one engine.

    python -m benchmarks.replicas_gpu [--rounds 3] [--json PATH]

Llama-3-8B shape, random bf16 weights, 32 distinct rank-16 adapters on all seven projections,
128-token prompts, 64 new greedy tokens, one adapter a row. The replicas are started by the
same code path as one replica per GPU (``ReplicaSet.start`` with ``--devices``, by default
``cuda:0,cuda:0``: each sizes its KV cache within half of the GPU's memory; ``cuda:0,cuda:1``
on two GPUs).

* one engine, batch 32;
* the replica set, 32 requests dispatched (16 land on each: distinct adapters, least-loaded);
* the same two engines driven directly, 16 requests each from two threads (no dispatcher);
* ``--one-engine own|default``: only one engine's batch-32 rate, its worker on its own CUDA
  stream or on the legacy default stream (run each in turn, a process each, for the A/B);
* ``--processes N``: one engine at batch 32, then N engines in N processes sharing the GPU
  (each within 1/N of its memory, 32/N requests each, started together at a barrier every
  round): the same replicas without a shared Python interpreter;
* correctness: batch-invariant engines (``batch_invariant=True``) give the same greedy tokens
  on one engine and through the dispatcher (a mixed set: adapters and the base).

Output tokens/s over the whole batch (prefill included), medians of the rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import multiprocessing
import statistics
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from unittest import mock

import torch

from benchmarks.rounds import parser, report_json
from multilora_studio.bench.random_adapters import write_random_adapter
from multilora_studio.deploy import ReplicaSet, parse_devices
from multilora_studio.engine import Engine, EngineConfig, SamplingParams, ServingEngine
from multilora_studio.engine.model.model_source import RANDOM_SHAPES
from multilora_studio.engine.step import device_setup
from multilora_studio.engine.step.device_setup import install_compile_watch

SHAPE = "llama3-8b"
BATCH = 32
NEW_TOKENS = 64
PARAMS = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)


def settings() -> EngineConfig:
    return EngineConfig(
        model=f"random:{SHAPE}", device="cuda", dtype="bfloat16", max_loras=BATCH, max_cpu_loras=BATCH,
        max_lora_rank=16, max_num_seqs=BATCH, max_model_len=256, max_num_batched_tokens=4096,
    )  # fmt: skip


def add_adapters(engine: ServingEngine, folders: list[Path]) -> list[str]:
    names = [folder.name for folder in folders]
    for name, folder in zip(names, folders, strict=True):
        engine.add_adapter(name, folder, preload=False)
    return names


def timed(run) -> float:
    """Output tokens/s of ``run()`` (which returns the outputs of the requests it ran)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    outputs = run()
    torch.cuda.synchronize()
    return sum(len(o.token_ids) for o in outputs) / (time.perf_counter() - start)


def both_directly(replicas: ReplicaSet, prompts: list[list[int]], names: list[str]) -> list:
    """Half the batch on each replica engine, from two threads, bypassing the dispatcher."""
    half = len(prompts) // 2
    results: list[list] = [[], []]

    def run(index: int) -> None:
        part = slice(index * half, (index + 1) * half)
        results[index] = replicas.replicas[index].generate(prompts[part], names[part], PARAMS)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results[0] + results[1]


def throughput(args: argparse.Namespace, folders: list[Path], prompts: list[list[int]]) -> dict:
    one: list[float] = []
    dispatched: list[float] = []
    direct: list[float] = []
    with Engine(settings()) as engine:
        names = add_adapters(engine, folders)
        engine.generate(prompts, names, PARAMS)  # warm-up: slots, graphs
        one = [timed(lambda e=engine, n=names: e.generate(prompts, n, PARAMS)) for _ in range(args.rounds)]
    with ReplicaSet.start(settings(), args.devices) as replicas:
        names = add_adapters(replicas, folders)
        replicas.generate(prompts, names, PARAMS)  # warm-up: each adapter on the replica it lands on
        placement = replicas.dispatched[:]
        for _ in range(args.rounds):
            dispatched.append(timed(lambda: replicas.generate(prompts, names, PARAMS)))
        both_directly(replicas, prompts, names)  # warm-up: the direct halves' adapters
        for _ in range(args.rounds):
            direct.append(timed(lambda: both_directly(replicas, prompts, names)))
        kv_blocks = [replica_kv_blocks(r) for r in replicas.replicas]
    one_tok_s = statistics.median(one)
    dispatched_tok_s = statistics.median(dispatched)
    direct_tok_s = statistics.median(direct)
    return {
        "one_engine_batch32_tok_s": one_tok_s,
        "two_replicas_dispatched_tok_s": dispatched_tok_s,
        "two_replicas_direct_tok_s": direct_tok_s,
        "warmup_placement": placement,
        "replica_kv_blocks": kv_blocks,
        "dispatched_over_one_engine": dispatched_tok_s / one_tok_s,
        "dispatched_over_direct": dispatched_tok_s / direct_tok_s,
    }


def replica_kv_blocks(replica: Engine) -> int:
    """The KV blocks a replica's share of the GPU gave it."""
    metrics = replica.metrics(fresh=True)
    if metrics is None:
        raise RuntimeError("replica reported no metrics")
    return metrics.kv_blocks_total


def on_default_stream() -> None:
    """``install_compile_watch``, run just after the worker set its own stream: back to the default."""
    torch.cuda.set_stream(torch.cuda.default_stream())
    install_compile_watch()


def one_engine(args: argparse.Namespace, folders: list[Path], prompts: list[list[int]]) -> float:
    """Batch-32 tokens/s of one engine, its worker on its own stream (as shipped) or, with
    ``--one-engine default``, back on the legacy default stream (each in a process of its own)."""
    skip = (
        mock.patch.object(device_setup, "install_compile_watch", on_default_stream)
        if args.one_engine == "default"
        else contextlib.nullcontext()
    )
    with skip, Engine(settings()) as engine:
        names = add_adapters(engine, folders)
        engine.generate(prompts, names, PARAMS)
        return statistics.median(
            timed(lambda: engine.generate(prompts, names, PARAMS)) for _ in range(args.rounds)
        )


def correctness(folders: list[Path], prompts: list[list[int]], devices: list[str]) -> dict:
    """Greedy tokens of a mixed set, batch-invariant bf16: one engine vs the dispatcher."""
    config = replace(settings(), batch_invariant=True)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    with Engine(config) as engine:
        names = add_adapters(engine, folders[:8])
        mixed = [*names, None, names[0], None, names[3]]
        expected = [o.token_ids for o in engine.generate(prompts[: len(mixed)], mixed, params)]
    with ReplicaSet.start(config, devices) as replicas:
        add_adapters(replicas, folders[:8])
        got = [o.token_ids for o in replicas.generate(prompts[: len(mixed)], mixed, params)]
        spread = replicas.dispatched[:]
    return {"requests": len(mixed), "equal": got == expected, "spread": spread,
            "rows_equal": sum(a == b for a, b in zip(got, expected, strict=True))}  # fmt: skip


def process_replica(index: int, count: int, folders: list[Path], prompts: list[list[int]], rounds: int,
                    barrier, results) -> None:  # fmt: skip
    """One of ``count`` engine processes: its part of the batch, each round from the barrier;
    puts (index, [(start, end, tokens) per round]) on ``results``."""
    part = slice(index * len(prompts) // count, (index + 1) * len(prompts) // count)
    config = replace(settings(), device_memory_share=1.0 / count)
    with Engine(config) as engine:
        names = add_adapters(engine, folders[part])
        engine.generate(prompts[part], names, PARAMS)  # warm-up: slots, graphs
        rows = []
        for _ in range(rounds):
            barrier.wait()
            start = time.perf_counter()  # CLOCK_MONOTONIC: one clock for every process
            outputs = engine.generate(prompts[part], names, PARAMS)
            torch.cuda.synchronize()
            rows.append((start, time.perf_counter(), sum(len(o.token_ids) for o in outputs)))
        results.put((index, rows))


def processes(args: argparse.Namespace, folders: list[Path], prompts: list[list[int]]) -> dict:
    """One engine at batch 32, then ``args.processes`` engine processes sharing the GPU."""
    with Engine(settings()) as engine:
        names = add_adapters(engine, folders)
        engine.generate(prompts, names, PARAMS)
        one = statistics.median(
            timed(lambda: engine.generate(prompts, names, PARAMS)) for _ in range(args.rounds)
        )
    torch.cuda.empty_cache()
    count = args.processes
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(count), context.Queue()
    workers = [
        context.Process(
            target=process_replica, args=(i, count, folders, prompts, args.rounds, barrier, results)
        )
        for i in range(count)
    ]
    for worker in workers:
        worker.start()
    rows = dict(results.get(timeout=900) for _ in workers)
    for worker in workers:
        worker.join(60)
    rates = []
    for r in range(args.rounds):
        spans = [rows[i][r] for i in range(count)]
        tokens = sum(span[2] for span in spans)
        rates.append(tokens / (max(span[1] for span in spans) - min(span[0] for span in spans)))
    together = statistics.median(rates)
    return {"one_engine_batch32_tok_s": one, f"{count}_processes_tok_s": together,
            "processes_over_one_engine": together / one}  # fmt: skip


def main() -> None:
    arguments = parser(__doc__)
    arguments.add_argument(
        "--one-engine", choices=("own", "default"), help="only one engine's rate, on this stream"
    )
    arguments.add_argument(
        "--devices",
        type=parse_devices,
        default=["cuda:0", "cuda:0"],
        help="the replicas' devices (default: two sharing cuda:0; cuda:0,cuda:1 on two GPUs)",
    )
    arguments.add_argument("--processes", type=int, default=None, help="engines in processes of their own")
    args = arguments.parse_args()
    logging.basicConfig(level=logging.WARNING)
    spec = RANDOM_SHAPES[SHAPE]
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, spec.vocab_size, (128,), generator=generator).tolist() for _ in range(BATCH)]
    with tempfile.TemporaryDirectory() as tmp:
        folders = [
            write_random_adapter(spec, Path(tmp) / f"adapter-{i}", 16, seed=i, dtype=torch.bfloat16)
            for i in range(BATCH)
        ]
        if args.processes is not None:
            print(json.dumps(processes(args, folders, prompts)), flush=True)
            return
        if args.one_engine is not None:
            print(json.dumps({"stream": args.one_engine, "tok_s": one_engine(args, folders, prompts)}))
            return
        result = {
            "device": torch.cuda.get_device_name(),
            "correctness": correctness(folders, prompts, args.devices),
        }
        report_json(result)
        result["throughput"] = throughput(args, folders, prompts)
    report_json(result, args.json)


if __name__ == "__main__":
    main()
