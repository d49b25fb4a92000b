"""What the logits processors cost: batch-32 decode with and without penalties on every row.

    python -m benchmarks.sampling_gpu [--rounds 3] [--json OUT.json]
    python -m benchmarks.sampling_gpu --cpu   # a small smoke run on the CPU (SmolLM2-135M shape)

Random bf16 weights of the Llama-3-8B shape, the base model, 128-token prompts, 64 new greedy
tokens. "with": every request sets presence, frequency and repetition penalties, a logit_bias
entry and a two-token bad word (engine/sampling/logits_processors.py). Decode tok/s after every
request had its first token; runs alternate ``--rounds`` times; medians and their ratio are
printed (the target on an H200 is a ratio >= 0.95).
"""

from __future__ import annotations

import logging

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
    return decode_tok_s(engine.generate(prompts, None, params))


def main() -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--cpu", action="store_true", help="small smoke run on the CPU")
    args = arguments.parse_args()
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
        prompts = random_prompts(batch, prompt_len, engine.spec.vocab_size, generator)
        decode_run(engine, prompts, new_tokens, True)  # warm-up
        result = alternate(
            args.rounds,
            lambda: decode_run(engine, prompts, new_tokens, False),
            lambda: decode_run(engine, prompts, new_tokens, True),
        )
    print(summary("decode, penalties", result))
    write_results(args.json, {"device": device_name(device), "shape": shape, "batch": batch, **result})


if __name__ == "__main__":
    main()
