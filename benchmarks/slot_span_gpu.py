"""What a shrink-in-GEMM step pays for slots it does not use: one adapter in the first slot against
the same adapter kind in the last slot, on CUDA, in one engine.

    python -m benchmarks.slot_span_gpu [--shape llama3-8b] [--slots 32] [--rounds 3] [--json PATH]

Every slot holds a random rank-16 adapter on all seven projections. A step multiplies the A rows
of the slots below the next power of two above its highest slot (``LoRAStep.slot_span``), so
the adapter in slot 0 reads one slot's A rows and the one in the last slot every slot's (what
every step read before). Single stream (128 new tokens) and batch 32 with that adapter on every
row (decode tok/s), base for reference, cases alternating, medians.
"""

from __future__ import annotations

import logging
import statistics
import tempfile
from pathlib import Path

import torch

from benchmarks.engine_gpu import run_batch
from benchmarks.rounds import parser, write_results
from multilora_studio.bench.random_adapters import write_random_adapter
from multilora_studio.engine import Engine, EngineConfig
from multilora_studio.engine.model.model_source import RANDOM_SHAPES


def main() -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--shape", default="llama3-8b")
    arguments.add_argument("--slots", type=int, default=32)
    args = arguments.parse_args()
    logging.basicConfig(level=logging.INFO)
    spec = RANDOM_SHAPES[args.shape]
    workdir = Path(tempfile.mkdtemp(prefix="mls-span-bench-"))
    config = EngineConfig(
        model=f"random:{args.shape}", device="cuda", dtype="bfloat16", max_loras=args.slots,
        max_cpu_loras=args.slots, max_lora_rank=16, max_num_seqs=32, max_model_len=256,
        max_num_batched_tokens=4096,
    )  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, spec.vocab_size, (128,), generator=generator).tolist()
    names = [f"span-{i}" for i in range(args.slots)]
    results: dict = {"shape": args.shape, "slots": args.slots, "gpu": torch.cuda.get_device_name()}
    with Engine(config) as engine:
        for i, name in enumerate(names):
            write_random_adapter(spec, workdir / name, 16, seed=i, dtype=torch.bfloat16)
            engine.add_adapter(name, workdir / name, preload=False)
        run_batch(engine, [prompt] * args.slots, names, 4)  # every slot filled
        slot_of: dict[str, int] = {}
        for name in names:
            slot = engine.worker.tiers.slots.slot_of(name)
            assert slot is not None, f"{name} is not in a slot after the warm-up"
            slot_of[name] = slot
        first = min(names, key=lambda n: slot_of[n])
        last = max(names, key=lambda n: slot_of[n])
        results["slots_of"] = {"first": slot_of[first], "last": slot_of[last]}
        cases: dict[str, tuple[list[list[int]], list[str | None], int]] = {
            "single stream, base": ([prompt], [None], 128),
            "single stream, first slot": ([prompt], [first], 128),
            "single stream, last slot": ([prompt], [last], 128),
            "batch 32, base": ([prompt] * 32, [None] * 32, 64),
            "batch 32, first slot on every row": ([prompt] * 32, [first] * 32, 64),
            "batch 32, last slot on every row": ([prompt] * 32, [last] * 32, 64),
        }
        for prompts, adapters, _ in cases.values():  # warm-up: each span's graphs captured
            run_batch(engine, prompts, adapters, 8)
        rounds: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.rounds):
            for name, (prompts, adapters, tokens) in cases.items():
                rounds[name].append(run_batch(engine, prompts, adapters, tokens)["decode_tok_s"])
    for name, values in rounds.items():
        results[name] = {"decode_tok_s": statistics.median(values), "rounds": values}
    for kind in ("single stream", "batch 32"):
        base = results[f"{kind}, base"]["decode_tok_s"]
        for name in rounds:
            if name.startswith(kind):
                results[name]["over_base"] = results[name]["decode_tok_s"] / base
    for name in rounds:
        row = results[name]
        print(f"  {name:<36} {row['decode_tok_s']:9.1f} tok/s  {row['over_base']:.3f} of base")
    write_results(args.json, results)


if __name__ == "__main__":
    main()
