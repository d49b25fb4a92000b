"""Engine throughput against HF transformers ``generate`` and PEFT mixed batches, in one run.

    python -m benchmarks.engine_vs_hf               # CPU, embedded model, float32
    python -m benchmarks.engine_vs_hf --skip-hf     # engine only

Prints a table; ``--json PATH`` writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from multilora_studio.bench.peft_baseline import PeftBaseline
from multilora_studio.bench.random_adapters import write_random_adapter
from multilora_studio.default_model import ensure_default_model
from multilora_studio.engine import Engine, EngineConfig, SamplingParams
from multilora_studio.engine.model.model_spec import load_spec

log = logging.getLogger(__name__)
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


def engine_rate(
    engine: Engine, prompts: list[list[int]], adapters: Sequence[str | None], new_tokens: int
) -> float:
    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    start = time.perf_counter()
    outputs = engine.generate(prompts, adapters, params)
    elapsed = time.perf_counter() - start
    assert all(len(o.token_ids) == new_tokens for o in outputs)
    return len(prompts) * new_tokens / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2, help="best of this many runs per case")
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.manual_seed(0)

    folder = ensure_default_model().path
    spec = load_spec(folder)
    workdir = Path(tempfile.mkdtemp(prefix="mls-bench-"))
    adapter_dirs = {
        f"bench-r{args.rank}-{i}": write_random_adapter(spec, workdir / f"a{i}", args.rank, seed=i)
        for i in range(args.adapters)
    }
    names = list(adapter_dirs)
    mixed = [names[i % len(names)] for i in range(args.batch)]
    results: dict[str, float] = {}

    def best(fn) -> float:
        return max(fn() for _ in range(args.repeats))

    config = EngineConfig(
        model=str(folder),
        device="cpu",
        dtype="float32",
        max_loras=max(8, args.adapters),
        max_lora_rank=max(16, args.rank),
        max_num_seqs=max(8, args.batch),
        max_model_len=1024,
    )
    with Engine(config) as engine:
        for name, path in adapter_dirs.items():
            engine.add_adapter(name, path)
        prompts = [engine.encode([{"role": "user", "content": p}]) for p in PROMPTS]
        batch_prompts = [prompts[i % len(prompts)] for i in range(args.batch)]
        engine_rate(engine, batch_prompts, mixed, 4)  # warm-up
        results["engine single stream"] = best(
            lambda: engine_rate(engine, prompts[:1], [None], args.new_tokens)
        )
        results[f"engine base batch {args.batch}"] = best(
            lambda: engine_rate(engine, batch_prompts, [None] * args.batch, args.new_tokens)
        )
        results[f"engine {args.batch} req / {args.adapters} adapters"] = best(
            lambda: engine_rate(engine, batch_prompts, mixed, args.new_tokens)
        )

    if not args.skip_hf:
        hf = PeftBaseline(str(folder), torch.float32, torch.device("cpu"))

        def hf_rate(batch: list[list[int]], adapters: list[str | None]) -> float:
            return hf.run_batch(batch, adapters, [args.new_tokens] * len(batch))["output_tok_s"]

        results["HF generate single stream"] = best(lambda: hf_rate(prompts[:1], [None]))
        results[f"HF generate base batch {args.batch}"] = best(
            lambda: hf_rate(batch_prompts, [None] * args.batch)
        )
        hf.load_adapters(adapter_dirs)
        results[f"PEFT {args.batch} req / {args.adapters} adapters"] = best(
            lambda: hf_rate(batch_prompts, list(mixed))
        )
        results["ratio single stream (engine / HF)"] = (
            results["engine single stream"] / results["HF generate single stream"]
        )
        key = f"{args.batch} req / {args.adapters} adapters"
        results["ratio mixed (engine / PEFT)"] = results[f"engine {key}"] / results[f"PEFT {key}"]

    print(
        f"\nCPU float32, {spec.num_layers}-layer {spec.hidden_size}-wide model, "
        f"{args.new_tokens} new tokens, rank {args.rank}, torch threads {torch.get_num_threads()}"
    )
    for label, value in results.items():
        unit = "x" if label.startswith("ratio") else "tok/s"
        print(f"  {label:<42} {value:8.2f} {unit}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
