"""What batch-invariant mode costs on the CPU: the same workloads with and without, in one run.

    python -m benchmarks.batch_invariance_cpu                 # embedded model, float32
    python -m benchmarks.batch_invariance_cpu --dtype bfloat16

Both engines are open at once and the cases alternate between them (best of ``--repeats``),
so a change in the machine's load hits both. Prints a table; ``--json PATH`` writes it.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from multilora_studio.bench.random_adapters import write_random_adapter
from multilora_studio.default_model import ensure_default_model
from multilora_studio.engine import Engine, EngineConfig, SamplingParams
from multilora_studio.engine.model.model_spec import load_spec

PROMPTS = [
    "Explain what a LoRA adapter is in two sentences.",
    "Write a short poem about the sea.",
    "What are three good habits for writing Python code?",
    "Describe the water cycle to a child.",
    "Give me a recipe for pancakes.",
    "Why is the sky blue?",
    "List five capital cities in Europe.",
    "How does a bicycle stay upright?",
]


def decode_rate(
    engine: Engine, prompts: list[list[int]], adapters: list[str | None], new_tokens: int
) -> float:
    """Generated tokens per second of one batched ``generate`` (prefill included)."""
    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    start = time.perf_counter()
    outputs = engine.generate(prompts, adapters, params)
    elapsed = time.perf_counter() - start
    assert all(len(o.token_ids) == new_tokens for o in outputs)
    return len(prompts) * new_tokens / elapsed


def prefill_rate(engine: Engine, prompt: list[int], adapter: str | None) -> float:
    """Prompt tokens per second of one long prompt and a single new token."""
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    start = time.perf_counter()
    engine.generate([prompt], [adapter], params)
    return len(prompt) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prefill-tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=2, help="best of this many runs per case")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    folder = ensure_default_model().path
    spec = load_spec(folder)
    workdir = Path(tempfile.mkdtemp(prefix="mls-invariance-"))
    adapter_dirs = {
        f"bench-r{args.rank}-{i}": write_random_adapter(spec, workdir / f"a{i}", args.rank, seed=i)
        for i in range(args.adapters)
    }
    names = list(adapter_dirs)
    mixed: list[str | None] = [names[i % len(names)] for i in range(args.batch)]
    modes = {"default": False, "batch-invariant": True}
    engines: dict[str, Engine] = {}
    for mode, invariant in modes.items():
        config = EngineConfig(
            model=str(folder),
            device="cpu",
            dtype=args.dtype,
            max_loras=max(8, args.adapters),
            max_lora_rank=max(16, args.rank),
            max_num_seqs=max(8, args.batch),
            max_model_len=1024,
            batch_invariant=invariant,
        )
        engines[mode] = engine = Engine(config)
        for name, path in adapter_dirs.items():
            engine.add_adapter(name, path)
    try:
        any_engine = engines["default"]
        prompts = [any_engine.encode([{"role": "user", "content": p}]) for p in PROMPTS]
        batch_prompts = [prompts[i % len(prompts)] for i in range(args.batch)]
        words = " ".join(PROMPTS).split()
        long_prompt = any_engine.encode(" ".join(words[i % len(words)] for i in range(args.prefill_tokens)))
        long_prompt = long_prompt[: args.prefill_tokens]
        cases: dict[str, Callable[[Engine], float]] = {
            "single stream, base": lambda e: decode_rate(e, prompts[:1], [None], args.new_tokens),
            f"{args.batch} req, base": lambda e: decode_rate(
                e, batch_prompts, [None] * args.batch, args.new_tokens
            ),
            f"{args.batch} req / {args.adapters} adapters": lambda e: decode_rate(
                e, batch_prompts, mixed, args.new_tokens
            ),
            f"prefill {len(long_prompt)} tokens, adapter": lambda e: prefill_rate(e, long_prompt, names[0]),
        }
        for engine in engines.values():  # warm-up
            decode_rate(engine, batch_prompts, mixed, 4)
        results: dict[str, dict[str, float]] = {case: {mode: 0.0 for mode in modes} for case in cases}
        for _ in range(args.repeats):
            for case, run in cases.items():
                for mode, engine in engines.items():
                    results[case][mode] = max(results[case][mode], run(engine))
    finally:
        for engine in engines.values():
            engine.shutdown()

    print(
        f"\nCPU {args.dtype}, {spec.num_layers}-layer {spec.hidden_size}-wide model, {args.new_tokens} new "
        f"tokens, rank {args.rank}, torch threads {torch.get_num_threads()}, best of {args.repeats}"
    )
    print(f"  {'case (tok/s)':<34} {'default':>9} {'invariant':>10} {'ratio':>6}")
    for case, by_mode in results.items():
        ratio = by_mode["batch-invariant"] / by_mode["default"]
        print(f"  {case:<34} {by_mode['default']:9.2f} {by_mode['batch-invariant']:10.2f} {ratio:6.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
