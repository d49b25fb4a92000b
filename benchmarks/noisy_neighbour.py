"""Two tenants on one server: a quiet one's latency alone and while a noisy one floods the
endpoint past its per-key limits (which answer it 429).

    python -m benchmarks.noisy_neighbour [--requests 12] [--flood-processes 4] [--max-concurrent 2]
        [--server-cpus 0 --client-cpus 1]

Prompts are token ids (random weights have no tokenizer).

The server runs in this process on the CPU (``random:smollm2-135m``, float32, one torch thread);
the quiet tenant sends ``--requests`` completions of 16 tokens one after another, first alone,
then while ``--flood-processes`` client processes of the noisy tenant send completions back to
back (no back-off after a 429); each
key may hold ``--max-concurrent`` requests at once. Prints the quiet tenant's latency p50 / p95
in both phases, their ratio (target: within +50 %) and the noisy tenant's answered and refused
requests, as JSON.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import time

import numpy as np
import openai

from multilora_studio.engine import Engine, EngineConfig
from multilora_studio.server import ApiServer, ServerConfig
from multilora_studio.server.api_keys import USER, ApiKey

QUIET, NOISY = "sk-quiet-tenant", "sk-noisy-tenant"


def quiet_latencies(client: openai.OpenAI, model: str, requests: int) -> list[float]:
    latencies = []
    for _ in range(requests):
        start = time.perf_counter()
        client.completions.create(model=model, prompt=[1, 450, 1920, 301, 88], max_tokens=16, temperature=0,
                                  extra_body={"ignore_eos": True})  # fmt: skip
        latencies.append(time.perf_counter() - start)
    return latencies


def flood(url: str, model: str, stop, answered, refused, cpus: set[int] | None) -> None:
    """The noisy tenant, in a process of its own (on ``cpus``): completions back to back until ``stop``."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    noisy = openai.OpenAI(base_url=url, api_key=NOISY, max_retries=0, timeout=120)
    while not stop.is_set():
        try:
            noisy.completions.create(model=model, prompt=list(range(100, 140)), max_tokens=32, temperature=0,
                                     extra_body={"ignore_eos": True})  # fmt: skip
            with answered.get_lock():
                answered.value += 1
        except openai.RateLimitError:
            with refused.get_lock():
                refused.value += 1


def cpu_list(text: str) -> set[int]:
    """``0,2-3`` -> {0, 2, 3}."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--flood-processes", type=int, default=4)
    parser.add_argument("--max-concurrent", type=int, default=2)
    parser.add_argument("--server-cpus", type=cpu_list, default=None,
                        help="CPUs of the server's process, e.g. 0 (default: all)")  # fmt: skip
    parser.add_argument("--client-cpus", type=cpu_list, default=None,
                        help="CPUs of the flooding processes, e.g. 1 (default: all)")  # fmt: skip
    args = parser.parse_args()
    if args.server_cpus:
        os.sched_setaffinity(0, args.server_cpus)
    config = EngineConfig(model="random:smollm2-135m", device="cpu", dtype="float32", cpu_threads=1,
                          max_model_len=256)  # fmt: skip
    keys = (ApiKey(QUIET, USER, None, "quiet"), ApiKey(NOISY, USER, None, "noisy"))
    with (
        Engine(config) as engine,
        ApiServer(
            engine, ServerConfig(port=0, api_keys=keys, max_concurrent_per_key=args.max_concurrent)
        ) as server,
    ):
        url = f"{server.url}/v1"
        quiet = openai.OpenAI(base_url=url, api_key=QUIET, max_retries=0, timeout=120)
        quiet_latencies(quiet, engine.model_name, 2)  # warm-up
        alone = quiet_latencies(quiet, engine.model_name, args.requests)
        context = multiprocessing.get_context("spawn")
        stop, answered, refused = context.Event(), context.Value("i", 0), context.Value("i", 0)
        workers = [
            context.Process(
                target=flood, args=(url, engine.model_name, stop, answered, refused, args.client_cpus)
            )
            for _ in range(args.flood_processes)
        ]
        if args.client_cpus:  # the children start (and import) on the clients' CPUs
            os.sched_setaffinity(0, args.client_cpus)
        for worker in workers:
            worker.start()
        if args.server_cpus:
            os.sched_setaffinity(0, args.server_cpus)
        deadline = time.monotonic() + 300
        while answered.value + refused.value < 2 * args.flood_processes and time.monotonic() < deadline:
            time.sleep(0.1)  # until every process floods
        crowded = quiet_latencies(quiet, engine.model_name, args.requests)
        stop.set()
        for worker in workers:
            worker.join(120)
    result = {
        "quiet_alone_p50_s": statistics.median(alone),
        "quiet_alone_p95_s": float(np.quantile(alone, 0.95)),
        "quiet_crowded_p50_s": statistics.median(crowded),
        "quiet_crowded_p95_s": float(np.quantile(crowded, 0.95)),
        "p50_ratio": statistics.median(crowded) / statistics.median(alone),
        "quiet_crowded_s": [round(latency, 3) for latency in crowded],
        "noisy_answered": answered.value,
        "noisy_refused_429": refused.value,
        "max_concurrent_per_key": args.max_concurrent,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
