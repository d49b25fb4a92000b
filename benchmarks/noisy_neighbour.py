"""Two tenants on one server: a quiet one's latency alone and while a noisy one floods the
endpoint past its per-key limits (which answer it 429).

    python -m benchmarks.noisy_neighbour [--requests 12] [--flood-threads 8] [--max-concurrent 2]

The server runs in this process on the CPU (``random:smollm2-135m``, float32, one torch thread);
the quiet tenant sends ``--requests`` completions of 16 tokens one after another, first alone,
then while ``--flood-threads`` threads of the noisy tenant send completions back to back; each
key may hold ``--max-concurrent`` requests at once. Prints the quiet tenant's latency p50 / p95
in both phases, their ratio (target: within +50 %) and the noisy tenant's answered and refused
requests, as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
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
        client.completions.create(model=model, prompt="The quiet tenant asks", max_tokens=16, temperature=0,
                                  extra_body={"ignore_eos": True})  # fmt: skip
        latencies.append(time.perf_counter() - start)
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--flood-threads", type=int, default=8)
    parser.add_argument("--max-concurrent", type=int, default=2)
    args = parser.parse_args()
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
        stop = threading.Event()
        counts = {"answered": 0, "refused": 0}
        lock = threading.Lock()

        def flood() -> None:
            noisy = openai.OpenAI(base_url=url, api_key=NOISY, max_retries=0, timeout=120)
            while not stop.is_set():
                try:
                    noisy.completions.create(model=engine.model_name, prompt="flood " * 20, max_tokens=32,
                                             temperature=0, extra_body={"ignore_eos": True})  # fmt: skip
                    outcome = "answered"
                except openai.RateLimitError:
                    outcome = "refused"
                    time.sleep(0.01)
                with lock:
                    counts[outcome] += 1

        threads = [threading.Thread(target=flood, daemon=True) for _ in range(args.flood_threads)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)  # the flood is running
        crowded = quiet_latencies(quiet, engine.model_name, args.requests)
        stop.set()
        for thread in threads:
            thread.join(120)
    result = {
        "quiet_alone_p50_s": statistics.median(alone),
        "quiet_alone_p95_s": float(np.quantile(alone, 0.95)),
        "quiet_crowded_p50_s": statistics.median(crowded),
        "quiet_crowded_p95_s": float(np.quantile(crowded, 0.95)),
        "p50_ratio": statistics.median(crowded) / statistics.median(alone),
        "noisy_answered": counts["answered"],
        "noisy_refused_429": counts["refused"],
        "max_concurrent_per_key": args.max_concurrent,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
