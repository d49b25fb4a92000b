"""Time to first token and prefill with adapters, two LoRA plans side by side in one engine.

    python -m benchmarks.prefill_ab_gpu [--rounds 5] [--rows 64] [--json PATH]

An engine as ``multilora-studio bench latency`` starts it (random Llama-3-8B shape, bf16, 32
slots, rank-16 adapters on all seven projections, 4,096-token steps), four adapters in slots
0-3. Plan A: the engine's own without the shrink in the GEMM above the token-major kernels;
plan B: with it over a slot span of up to ``--rows`` A rows a slice
(``LoRAPlan.grouped_shrink_in_gemm_rows``); ``--old-tiles``: both again with the slot-grouped
kernels' tiles from before the prefill tile sweep. Prefill steps run eagerly, so the model's plan is
swapped between runs. Rounds alternate A and B; each round measures the TTFT of a 2,048-token
prompt on the base and on one adapter, and prompt tokens/s of 16 x 1,024 prompts on the base
and over four adapters. Medians and ratios are printed, and whether A and B give the same
first tokens.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from multilora_studio.bench.latency import prefill_rate, time_to_first_token
from multilora_studio.bench.random_adapters import write_random_adapter
from multilora_studio.bench.workloads import prompt_token_ids
from multilora_studio.engine import Engine, EngineConfig, RequestOutput, SamplingParams
from multilora_studio.engine.model.model_source import RANDOM_SHAPES
from multilora_studio.kernels import LoRAPlan, lora_sgmv


def old_expand_config(num_tokens: int) -> lora_sgmv.ExpandConfig:
    if num_tokens <= 64:
        return lora_sgmv.ExpandConfig(block_m=16, block_n=256)
    if num_tokens <= 256:
        return lora_sgmv.ExpandConfig(block_m=32, block_n=256)
    return lora_sgmv.ExpandConfig(block_m=64, block_n=256, num_warps=8)


def old_shrink_config(
    num_tokens: int, in_features: int, num_slices: int, max_rank: int
) -> lora_sgmv.ShrinkConfig:
    new = NEW_SHRINK(num_tokens, in_features, num_slices, max_rank)
    cap = 1 << max(0, max(1, 8192 // num_tokens).bit_length() - 1)
    return dataclasses.replace(new, split_k=min(new.split_k, cap))


NEW_EXPAND, NEW_SHRINK = lora_sgmv.expand_config, lora_sgmv.shrink_config


def prompt_scores(output: RequestOutput) -> list[float]:
    """The log-probability of each prompt token after the first."""
    return [lp.logprob for lp in output.prompt_logprobs or () if lp is not None]


def use_plan(model: Any, name: str, plan: LoRAPlan) -> None:
    """On the worker: the model's plan, and the slot-grouped tiles the variant names."""
    model.plan = plan
    old = name.endswith("old-tiles")
    lora_sgmv.expand_config = old_expand_config if old else NEW_EXPAND
    lora_sgmv.shrink_config = old_shrink_config if old else NEW_SHRINK


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", type=int, default=64, help="plan B's grouped_shrink_in_gemm_rows")
    parser.add_argument("--old-tiles", action="store_true", help="also both plans with the earlier tiles")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    spec = RANDOM_SHAPES["llama3-8b"]
    workdir = Path(tempfile.mkdtemp(prefix="mls-prefill-ab-"))
    config = EngineConfig(
        model="random:llama3-8b", device="cuda", dtype="bfloat16", max_loras=32, max_lora_rank=16,
        max_num_seqs=32, max_model_len=2048 + 64, max_num_batched_tokens=4096,
    )  # fmt: skip
    rng = np.random.default_rng(0)
    long_prompt = prompt_token_ids(2048, rng, spec.vocab_size)
    prefill = [prompt_token_ids(1024, rng, spec.vocab_size) for _ in range(16)]
    results: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "rows": args.rows}
    with Engine(config) as engine:
        names = []
        for i in range(4):
            folder = write_random_adapter(spec, workdir / f"a{i}", 16, seed=i, dtype=torch.bfloat16)
            engine.add_adapter(f"a{i}", folder)
            names.append(f"a{i}")
        model = engine.runner.model
        plain = dataclasses.replace(model.plan, grouped_shrink_in_gemm_rows=0)
        grouped = dataclasses.replace(model.plan, grouped_shrink_in_gemm_rows=args.rows)
        plans = {"A": plain, "B": grouped}
        if args.old_tiles:  # the slot-grouped kernels' tiles before the prefill sweep, for both plans
            plans |= {"A-old-tiles": plain, "B-old-tiles": grouped}
        engine_plan = model.plan
        adapters = [names[i % 4] for i in range(16)]
        one = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, prompt_logprobs=0)
        cases = {
            "TTFT base ms": lambda: 1e3 * time_to_first_token(engine, long_prompt, None),
            "TTFT adapter ms": lambda: 1e3 * time_to_first_token(engine, long_prompt, names[0]),
            "prefill base tok/s": lambda: prefill_rate(engine, prefill, [None] * 16),
            "prefill 4 adapters tok/s": lambda: prefill_rate(engine, prefill, adapters),
        }
        samples: dict[str, dict[str, list[float]]] = {p: {c: [] for c in cases} for p in plans}
        tokens, scores = {}, {}
        for name, plan in plans.items():  # warm-up, and the tokens each plan gives
            engine.call_on_worker(functools.partial(use_plan, model, name, plan))
            for measure in cases.values():
                measure()
            outs = engine.generate([long_prompt, *prefill[:4], long_prompt], [names[0], *names, None], one)
            tokens[name] = [o.token_ids for o in outs]
            scores[name] = [prompt_scores(o) for o in outs]
        for _ in range(args.rounds):
            for name, plan in plans.items():
                engine.call_on_worker(functools.partial(use_plan, model, name, plan))
                for case, measure in cases.items():
                    samples[name][case].append(measure())
        engine.call_on_worker(functools.partial(use_plan, model, "engine", engine_plan))
    median = {p: {c: statistics.median(v) for c, v in cs.items()} for p, cs in samples.items()}
    results |= {
        "samples": samples,
        "median": median,
        "same_tokens": {p: tokens[p] == tokens["A"] for p in plans},
    }
    # prompt log-probabilities against plan A's: the largest difference per variant, and the
    # adapter's own effect on the long prompt (its scores against the base's) for scale
    diff = {
        p: max(
            max(abs(a - b) for a, b in zip(x, y, strict=True))
            for x, y in zip(scores[p][:5], scores["A"][:5], strict=True)
        )
        for p in plans
    }
    effect = max(abs(a - b) for a, b in zip(scores["A"][0], scores["A"][5], strict=True))
    results |= {"prompt_logprob_max_diff_vs_A": diff, "adapter_effect_max": effect}
    print(
        f"prompt log-prob max |diff| vs A: {diff}; "
        f"the adapter's own effect (A, adapter vs base): {effect:.3f}"
    )
    for p in plans:
        m = median[p]
        results[f"{p}_ttft_ratio"] = m["TTFT adapter ms"] / m["TTFT base ms"]
        results[f"{p}_prefill_ratio"] = m["prefill 4 adapters tok/s"] / m["prefill base tok/s"]
        print(
            f"plan {p}: TTFT base {m['TTFT base ms']:.1f} ms, adapter {m['TTFT adapter ms']:.1f} ms "
            f"(ratio {results[f'{p}_ttft_ratio']:.3f}); prefill base {m['prefill base tok/s']:.0f}, "
            f"4 adapters {m['prefill 4 adapters tok/s']:.0f} tok/s "
            f"(ratio {results[f'{p}_prefill_ratio']:.3f})"
        )
    print(
        f"same first tokens as A: {results['same_tokens']} "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
