"""What the logits processors cost: batch-32 decode with and without penalties on every row.

    python -m benchmarks.sampling_gpu [--rounds 3] [--json OUT.json]
    python -m benchmarks.sampling_gpu --cpu   # a small smoke run on the CPU (SmolLM2-135M shape)

Random bf16 weights of the Llama-3-8B shape, the base model, 128-token prompts, 64 new greedy
tokens. "with": every request sets presence, frequency and repetition penalties, a logit_bias
entry and a two-token bad word (engine/logits_processors.py). Decode tok/s after every
request had its first token; runs alternate ``--rounds`` times; medians and their ratio are
printed (the target on an H200 is a ratio >= 0.95).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
from pathlib import Path

import torch

from multilora_studio.engine import Engine, EngineConfig, SamplingParams


def decode_run(engine: Engine, prompts: list[list[int]], new_tokens: int, penalised: bool) -> float:
    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    if penalised:
        params = SamplingParams(
            max_tokens=new_tokens,
            temperature=0,
            ignore_eos=True,
            presence_penalty=0.5,
            frequency_penalty=0.3,
            repetition_penalty=1.2,
            logit_bias={17: 1.5},
            bad_words_token_ids=[[11, 12]],
        )
    outputs = engine.generate(prompts, None, params)
    first = max(o.first_token_time or 0.0 for o in outputs)
    finish = max(o.finish_time or 0.0 for o in outputs)
    return sum(len(o.token_ids) - 1 for o in outputs) / (finish - first)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--cpu", action="store_true", help="small smoke run on the CPU")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    shape, device, dtype = (
        ("smollm2-135m", "cpu", "float32") if args.cpu else ("llama3-8b", "cuda", "bfloat16")
    )
    batch, prompt_len, new_tokens = (4, 16, 6) if args.cpu else (32, 128, 64)
    config = EngineConfig(
        model=f"random:{shape}",
        device=device,
        dtype=dtype,
        max_loras=1,
        max_num_seqs=batch,
        max_model_len=prompt_len + new_tokens + 16,
        max_num_batched_tokens=max(batch * prompt_len, 256),
    )
    generator = torch.Generator().manual_seed(0)
    with Engine(config) as engine:
        vocab = engine.spec.vocab_size
        prompts = [torch.randint(0, vocab, (prompt_len,), generator=generator).tolist() for _ in range(batch)]
        decode_run(engine, prompts, new_tokens, True)  # warm-up
        plain, penalised = [], []
        for _ in range(args.rounds):
            plain.append(decode_run(engine, prompts, new_tokens, False))
            penalised.append(decode_run(engine, prompts, new_tokens, True))
    without, with_ = statistics.median(plain), statistics.median(penalised)
    results = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "shape": shape,
        "batch": batch,
        "without_tok_s": without,
        "with_tok_s": with_,
        "ratio": with_ / without,
        "rounds_without": plain,
        "rounds_with": penalised,
    }
    print(
        f"decode without {without:9.1f} tok/s  with penalties {with_:9.1f} tok/s  ratio {with_ / without:.3f}"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
