"""What the prefix cache buys and costs: time to first token over a shared prefix, four-choice
scoring, and decode with nothing shared, against the cache off, in one run.

    python -m benchmarks.prefix_cache                      # the CPU, the embedded model
    python -m benchmarks.prefix_cache --model random:llama3-8b --device cuda --dtype bfloat16 \\
        --prefix-len 4000 --questions 16 --context-len 1000 --decode-batch 32 --json OUT.json

Rank-16 random adapters on all seven projections. Each round draws new random tokens, so
every first sight of a prefix is cold.

- ``ttft``: a request of ``--prefix-len`` tokens and 32 of its own, then a second request with
  that prefix and 32 other tokens (same adapter): the second's time to first token over the
  first's (the target is <= 0.2 on the CPU, <= 0.1 on a GPU).
- ``scoring``: ``--questions`` contexts of ``--context-len`` tokens over 4 adapters, each with
  four 8-token choices scored as Evaluate and lm-evaluation-harness score them (the choice's
  tokens only), all submitted at once: choices per second, cache on over cache off (>= 2.5).
- ``decode``: ``--decode-batch`` distinct prompts of 128 tokens, 64 new tokens each, one
  adapter a row: decode tok/s, cache on over cache off (>= 0.99).
"""

from __future__ import annotations

import functools
import logging
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.rounds import (
    alternate,
    decode_tok_s,
    device_name,
    parser,
    random_prompts,
    summary,
    write_results,
)
from multilora_studio.bench.random_adapters import write_random_adapter
from multilora_studio.engine import Engine, EngineConfig, SamplingParams
from multilora_studio.engine.step.step_trace import records_as_dicts

SUFFIX = 32
CHOICES = 4
CHOICE_LEN = 8
ADAPTERS = 4


def ttft_rounds(engine: Engine, args, vocab: int, generator: torch.Generator) -> dict:
    """Per round: the cold request's and the warm one's time to first token."""
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    cold: list[float] = []
    warm: list[float] = []
    cached, steps = [], []
    for _ in range(args.rounds):
        prefix, first, second = random_prompts(3, args.prefix_len, vocab, generator)
        (a,) = engine.generate([prefix + first[:SUFFIX]], ["a0"], params)
        since = time.perf_counter()
        (b,) = engine.generate([prefix + second[:SUFFIX]], ["a0"], params)
        assert a.ttft is not None and b.ttft is not None
        cold.append(a.ttft)
        warm.append(b.ttft)
        cached.append(b.num_cached_tokens)
        steps.append(records_as_dicts(engine.step_trace.snapshot(since=since)))  # the warm one's step
    ratios = [w / c for c, w in zip(cold, warm, strict=True)]
    return {
        "cold_s": cold,
        "warm_s": warm,
        "cached_tokens": cached,
        "ratio": statistics.median(ratios),
        "warm_steps": steps,
    }


def scoring_run(engine: Engine, args, vocab: int, seed: int) -> float:
    """Choices scored per second: every question's four continuations submitted at once."""
    generator = torch.Generator().manual_seed(seed)  # new questions: every context is seen first here
    contexts = random_prompts(args.questions, args.context_len, vocab, generator)
    requests = []
    for index, context in enumerate(contexts):
        for choice in random_prompts(CHOICES, CHOICE_LEN, vocab, generator):
            params = SamplingParams(max_tokens=0, prompt_logprobs=0, prompt_logprobs_start=len(context))
            requests.append((context + choice, f"a{index % ADAPTERS}", params))
    start = time.perf_counter()
    outputs = [stream.result() for stream in engine.submit_many(requests)]
    seconds = time.perf_counter() - start
    assert all(output.error is None for output in outputs)
    return len(requests) / seconds


def decode_run(engine: Engine, prompts: list[list[int]], adapters: list[str]) -> float:
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    return decode_tok_s(engine.generate(prompts, adapters, params))


def engine_config(args, caching: bool) -> EngineConfig:
    model = {"model": args.model} if args.model else {}  # the embedded model by default
    return EngineConfig(
        **model,
        device=args.device,
        dtype=args.dtype,
        max_loras=max(ADAPTERS, args.decode_batch),
        max_lora_rank=16,
        max_num_seqs=max(args.decode_batch, args.questions * CHOICES),
        max_model_len=max(args.prefix_len + SUFFIX, args.context_len + CHOICE_LEN, 128 + 64) + 16,
        max_num_batched_tokens=max(2048, args.context_len + CHOICE_LEN),
        kv_cache_memory_gb=args.kv_cache_gb,
        enable_prefix_caching=caching,
    )


def main() -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--model", default=None, help="the base (default: the embedded model)")
    arguments.add_argument("--device", default="cpu")
    arguments.add_argument("--dtype", default="float32")
    arguments.add_argument("--prefix-len", type=int, default=2000)
    arguments.add_argument("--questions", type=int, default=4)
    arguments.add_argument("--context-len", type=int, default=300)
    arguments.add_argument("--decode-batch", type=int, default=8)
    arguments.add_argument("--kv-cache-gb", type=float, default=None, help="each engine's KV cache")
    args = arguments.parse_args()
    logging.basicConfig(level=logging.WARNING)
    results: dict = {"device": device_name(args.device), "model": args.model or "embedded"}
    cached, uncached = Engine(engine_config(args, True)), Engine(engine_config(args, False))
    try:
        spec, vocab = cached.spec, cached.spec.vocab_size
        workdir = Path(tempfile.mkdtemp(prefix="mls-prefix-bench-"))
        dtype = getattr(torch, args.dtype)
        names = [f"a{i}" for i in range(max(ADAPTERS, args.decode_batch))]
        folders = {}
        for seed, name in enumerate(names):
            folders[name] = write_random_adapter(spec, workdir / name, 16, seed=seed, dtype=dtype)
        for engine in (cached, uncached):
            for name, folder in folders.items():
                engine.add_adapter(name, folder)
        generator = torch.Generator().manual_seed(0)
        warm_up = random_prompts(1, 64, vocab, generator)
        for engine in (cached, uncached):
            engine.generate(
                warm_up * ADAPTERS, [f"a{i}" for i in range(ADAPTERS)], SamplingParams(max_tokens=2)
            )
        results["ttft"] = ttft_rounds(cached, args, vocab, generator)
        seeds = iter(range(1000, 2000))
        results["scoring"] = alternate(
            args.rounds,
            lambda: scoring_run(uncached, args, vocab, next(seeds)),
            lambda: scoring_run(cached, args, vocab, next(seeds)),
        )
        prompts = random_prompts(args.decode_batch, 128, vocab, generator)
        names = names[: args.decode_batch]
        for engine in (cached, uncached):
            decode_run(engine, prompts, names)  # adapters into slots
        fresh = functools.partial(random_prompts, args.decode_batch, 128, vocab, generator)
        results["decode"] = alternate(
            args.rounds,
            lambda: decode_run(uncached, fresh(), names),
            lambda: decode_run(cached, fresh(), names),
        )
        metrics = cached.metrics(fresh=True)
        assert metrics is not None
        results["cache_metrics"] = {
            "hit_rate": metrics.prefix_cache_hit_rate,
            "blocks": metrics.prefix_cache_blocks,
        }
    finally:
        cached.shutdown()
        uncached.shutdown()
    ttft = results["ttft"]
    print(f"device {results['device']}, model {results['model']}, prefix {args.prefix_len} tokens")
    for cold, warm, hit in zip(ttft["cold_s"], ttft["warm_s"], ttft["cached_tokens"], strict=True):
        print(f"ttft             cold {cold:8.3f} s  warm {warm:8.3f} s  ({hit} tokens cached)")
    print(f"ttft             warm / cold, median of rounds: {ttft['ratio']:.3f}")
    for step in ttft["warm_steps"][-1]:
        print(f"warm step        {step}")
    print(summary("scoring", results["scoring"], "choices/s"))
    print(summary("decode", results["decode"]))
    write_results(args.json, results)


if __name__ == "__main__":
    main()
