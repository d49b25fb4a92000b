"""What log-probabilities cost on a GPU: decode with ``logprobs=5`` and prompt scoring, with and without.

    python -m benchmarks.logprobs_gpu [--json OUT.json]

Random bf16 weights of the Llama-3-8B shape, rank-16 adapters on all seven projections.
Decode: batch 32, 128-token prompts, 64 new tokens, 32 distinct adapters and the base only,
with and without ``logprobs=5`` on every request (decode tok/s after every request had its
first token). Prompt scoring: 16 prompts x 1024 tokens over 4 distinct adapters, one new
token, with and without ``prompt_logprobs=1`` (prefill tok/s: prompt tokens over the time to
the last first token). Runs alternate ``--rounds`` times; medians and their ratios are printed.
"""

from __future__ import annotations

import functools
import logging
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.engine_gpu import run_batch
from benchmarks.rounds import alternate, decode_tok_s, parser, random_prompts, summary, write_results
from multilora_studio.bench.random_adapters import write_random_adapter
from multilora_studio.engine import Engine, EngineConfig, SamplingParams
from multilora_studio.engine.model.model_source import RANDOM_SHAPES
from multilora_studio.kernels.row_scores import row_scores, top_k_torch


def decode_run(engine: Engine, prompts: list[list[int]], adapters: list, logprobs: int | None) -> float:
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True, logprobs=logprobs)
    outputs = engine.generate(prompts, adapters, params)
    assert logprobs is None or all(len(o.logprobs or []) == len(o.token_ids) for o in outputs)
    return decode_tok_s(outputs)


def entries_ms(engine: Engine, prompts: list[list[int]], adapters: list) -> float:
    """Milliseconds the caller's thread takes to read every entry of the prompts' scores."""
    params = SamplingParams(max_tokens=0, prompt_logprobs=1)
    outputs = engine.generate(prompts, adapters, params)
    start = time.perf_counter()
    assert all(entry is not None for o in outputs for entry in list(o.prompt_logprobs or [])[1:])
    return (time.perf_counter() - start) * 1000


def prefill_run(engine: Engine, prompts: list[list[int]], adapters: list, scored: bool) -> float:
    params = SamplingParams(
        max_tokens=1, temperature=0, ignore_eos=True, prompt_logprobs=1 if scored else None
    )
    start = time.perf_counter()
    outputs = engine.generate(prompts, adapters, params)
    end = time.perf_counter()
    assert not scored or all(
        len(o.prompt_logprobs or []) == len(p) for o, p in zip(outputs, prompts, strict=True)
    )
    return sum(len(p) for p in prompts) / (end - start)


def time_ms(work, repeats: int = 20) -> float:
    """Median milliseconds of ``work()`` on the device (CUDA events, after a warm-up call)."""
    work()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        work()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def scoring_kernels(vocab: int) -> dict:
    """Device time of scoring decode-sized and prompt-chunk-sized logits: the Triton pair, the torch
    reductions and torch.topk alone, side by side (float32; bf16 too for the prompt chunk)."""
    timings = {}
    for rows, k, dtype in (
        (32, 5, torch.float32),
        (256, 1, torch.bfloat16),
        (1024, 1, torch.float32),
        (1024, 5, torch.float32),
    ):
        logits = torch.randn(rows, vocab, device="cuda").to(dtype)
        chosen = torch.randint(0, vocab, (rows,), device="cuda")
        name = f"{rows}x{k}_{str(dtype).removeprefix('torch.')}"
        for backend in ("triton", "torch"):
            timings[f"row_scores_{backend}_{name}_ms"] = time_ms(
                lambda x=logits, c=chosen, k=k, b=backend: row_scores(x, c, k, backend=b)
            )
        timings[f"torch_topk_{name}_ms"] = time_ms(lambda x=logits, k=k: torch.topk(x, k, dim=-1))
        timings[f"top_k_torch_{name}_ms"] = time_ms(lambda x=logits, k=k: top_k_torch(x.float(), k))
    return timings


def profile_prefill(engine: Engine, prompts: list[list[int]], adapters: list) -> None:
    """The ops of one scored and one unscored prefill by device time (torch.profiler), side by side."""
    for scored in (False, True):
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        ) as profile:
            prefill_run(engine, prompts, adapters, scored)
        print(f"--- prefill, prompt_logprobs={'1' if scored else 'None'}")
        table = profile.key_averages().table(
            sort_by="self_cuda_time_total", row_limit=14, max_name_column_width=48
        )
        print(table)


def main() -> None:
    arguments = parser(__doc__)
    arguments.add_argument(
        "--profile", action="store_true", help="print where a scored prefill spends its time"
    )
    args = arguments.parse_args()
    logging.basicConfig(level=logging.WARNING)
    spec = RANDOM_SHAPES["llama3-8b"]
    workdir = Path(tempfile.mkdtemp(prefix="mls-logprobs-bench-"))
    adapters = {
        f"a{i}": write_random_adapter(spec, workdir / f"a{i}", 16, seed=i, dtype=torch.bfloat16)
        for i in range(32)
    }
    generator = torch.Generator().manual_seed(0)

    config = EngineConfig(
        model="random:llama3-8b",
        device="cuda",
        dtype="bfloat16",
        max_loras=32,
        max_lora_rank=16,
        max_num_seqs=32,
        max_model_len=1024 + 64 + 16,
        max_num_batched_tokens=4096,
    )
    results: dict = {"gpu": torch.cuda.get_device_name(), **scoring_kernels(spec.vocab_size)}
    for key, value in results.items():
        if key.endswith("_ms"):
            print(f"{key:44s} {value:8.3f} ms")
    with Engine(config) as engine:
        for name, path in adapters.items():
            engine.add_adapter(name, path)
        decode_prompts = random_prompts(32, 128, spec.vocab_size, generator)
        distinct, base = list(adapters), [None] * 32
        run_batch(engine, decode_prompts, distinct, 8)  # warm-up: adapters into slots
        decode_run(engine, decode_prompts, base, 5)
        for name, names in (("base", base), ("distinct", distinct)):
            results[f"decode_{name}"] = alternate(
                args.rounds,
                functools.partial(decode_run, engine, decode_prompts, names, None),
                functools.partial(decode_run, engine, decode_prompts, names, 5),
            )
        score_prompts = random_prompts(16, 1024, spec.vocab_size, generator)
        four = [f"a{i % 4}" for i in range(16)]
        prefill_run(engine, score_prompts, four, True)  # warm-up
        results["prompt_scoring"] = alternate(
            args.rounds,
            lambda: prefill_run(engine, score_prompts, four, False),
            lambda: prefill_run(engine, score_prompts, four, True),
        )
        results["prompt_entries_read_ms"] = entries_ms(engine, score_prompts, four)
        print(f"reading the {16 * 1023} prompt entries: {results['prompt_entries_read_ms']:.1f} ms")
        if args.profile:
            profile_prefill(engine, score_prompts, four)
    for key in ("decode_base", "decode_distinct", "prompt_scoring"):
        print(summary(key, results[key]))
    write_results(args.json, results)


if __name__ == "__main__":
    main()
