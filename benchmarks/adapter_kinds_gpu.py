"""Decode throughput of DoRA, LoRA-with-bias and vocabulary-row adapters against plain LoRA rows
on CUDA, in one run.

    python -m benchmarks.adapter_kinds_gpu [--shape llama3-8b] [--rounds 2] [--cases DoRA,...] [--json PATH]

Batch 32 (128-token prompts, 64 new tokens, random bf16 weights), 32 distinct rank-16 adapters
on all seven projections per case, with CUDA graphs: plain LoRA, DoRA, LoRA with bias,
"4 lm_head": 4 adapters with their own lm_head (modules_to_save) beside 28 plain ones, and
"trained tokens": 32 adapters with 16 retrained token rows each. The cases alternate
``--rounds`` times (medians), so each ratio is measured side by side in one engine.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
from pathlib import Path

import torch

from benchmarks.engine_gpu import run_batch
from benchmarks.rounds import report_lines
from multilora_studio.bench.random_adapters import KINDS, write_random_adapter
from multilora_studio.engine import Engine, EngineConfig
from multilora_studio.engine.model.model_source import RANDOM_SHAPES

HEADS = 4  # adapters with their own lm_head in the "4 lm_head" case (the pool's default count)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", default="llama3-8b")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--cases", default="", help="comma-separated cases to run besides LoRA (default: every case)"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    spec = RANDOM_SHAPES[args.shape]
    workdir = Path(tempfile.mkdtemp(prefix="mls-kinds-bench-"))
    names = {
        kind: [f"{kind.split()[0].lower()}{'-bias' if 'bias' in kind else ''}-{i}" for i in range(args.batch)]
        for kind in KINDS
    }
    # case -> (kind, tables) of each adapter written for it
    made = {name: (kind, "") for kind in KINDS for name in names[kind]}
    names["4 lm_head"] = [f"head-{i}" for i in range(HEADS)] + names["LoRA"][HEADS:]
    made |= {f"head-{i}": ("LoRA", "lm_head") for i in range(HEADS)}
    names["trained tokens"] = [f"tokens-{i}" for i in range(args.batch)]
    made |= {name: ("LoRA", "tokens") for name in names["trained tokens"]}
    picked = {name.strip() for name in args.cases.split(",") if name.strip()}
    unknown = picked - set(names)
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)}; cases: {', '.join(names)}")
    cases = [case for case in names if not picked or case == "LoRA" or case in picked]
    made = {name: made[name] for case in cases for name in names[case]}
    config = EngineConfig(
        model=f"random:{args.shape}",
        device="cuda",
        dtype="bfloat16",
        max_loras=args.batch,
        max_cpu_loras=len(made),
        token_table_memory_gb=HEADS * spec.vocab_size * spec.hidden_size * 2 / 2**30 + 0.5,
        max_lora_rank=args.rank,
        max_num_seqs=args.batch,
        max_model_len=args.prompt_len + args.new_tokens + 16,
        max_num_batched_tokens=max(2048, args.batch * args.prompt_len),
    )
    generator = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(0, spec.vocab_size, (args.prompt_len,), generator=generator).tolist()
        for _ in range(args.batch)
    ]
    rounds: dict[str, list[float]] = {case: [] for case in cases}
    results: dict = {
        "shape": args.shape,
        "batch": args.batch,
        "rank": args.rank,
        "gpu": torch.cuda.get_device_name(),
    }
    with Engine(config) as engine:
        for i, (name, (kind, tables)) in enumerate(made.items()):
            folder = workdir / name
            write_random_adapter(
                spec, folder, args.rank, seed=i, dtype=torch.bfloat16, kind=kind, tables=tables
            )
            engine.add_adapter(name, folder, preload=False)
        for case in cases:  # warm-up: slots filled, DoRA norms computed, graphs captured
            run_batch(engine, prompts, names[case], 8)
        for _ in range(args.rounds):
            for case in cases:
                rounds[case].append(run_batch(engine, prompts, names[case], args.new_tokens)["decode_tok_s"])
    lora = statistics.median(rounds["LoRA"])
    for case in cases:
        results[f"{case}_decode_tok_s"] = statistics.median(rounds[case])
        results[f"{case}_over_lora"] = statistics.median(rounds[case]) / lora
        results[f"{case}_rounds"] = rounds[case]
    report_lines(results, args.json, 32)


if __name__ == "__main__":
    main()
