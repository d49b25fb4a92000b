"""What structured output costs in decode: half the batch under a JSON schema vs no grammar.

    python -m benchmarks.structured_gpu [--tokenizer DIR] [--json OUT.json]
    python -m benchmarks.structured_gpu --shape smollm2-135m --device cpu --batch 4 --new-tokens 8  # smoke

Random bf16 weights of the Llama-3-8B shape (``--shape``), batch 32, 128-token prompts, 64 new
tokens, base model only. "with": every other request carries a JSON schema (an array of objects
that cannot end within 64 tokens, so every row decodes to the end); "without": the same requests
free. Decode tok/s after every request had its first token; runs alternate ``--rounds`` times and
the medians' ratio is printed (target >= 0.9). Random shapes have no tokenizer: the grammars use
the one in ``--tokenizer`` (default: .device_pkg/tokenizer, else the embedded model's), its
vocabulary masked onto the model's (ids past it are never allowed).
"""

from __future__ import annotations

import json
import logging
import tempfile
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
from multilora_studio.engine import Engine, EngineConfig, SamplingParams, StructuredOutput
from multilora_studio.engine.model.model_source import RANDOM_SHAPES, load_tokenizer
from multilora_studio.engine.sampling.grammar import GrammarCompiler

SCHEMA = {
    "type": "array",
    "minItems": 50,
    "items": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "name": {"type": "string"},
            "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}},
            "ok": {"type": "boolean"},
        },
        "required": ["id", "name", "tags", "ok"],
        "additionalProperties": False,
    },
}


def tokenizer_folder(given: Path | None) -> Path:
    if given is not None:
        return given
    packaged = Path(".device_pkg/tokenizer")
    if packaged.exists():
        return packaged
    from multilora_studio.default_model import gguf_path
    from tests.fixtures import extract_tokenizer

    return extract_tokenizer(gguf_path(), Path(tempfile.mkdtemp(prefix="mls-tokenizer-")))


def decode_run(engine: Engine, prompts: list[list[int]], new_tokens: int, constrained: bool) -> float:
    spec = StructuredOutput(json_schema=json.dumps(SCHEMA))
    params = [
        SamplingParams(
            max_tokens=new_tokens,
            temperature=0,
            ignore_eos=True,
            structured=spec if constrained and i % 2 == 0 else None,
        )
        for i in range(len(prompts))
    ]
    outputs = engine.generate(prompts, None, params)
    assert all(len(o.token_ids) == new_tokens for o in outputs), [o.finish_reason for o in outputs]
    return decode_tok_s(outputs)


def main() -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--shape", default="llama3-8b", choices=sorted(RANDOM_SHAPES))
    arguments.add_argument("--device", default="cuda")
    arguments.add_argument("--batch", type=int, default=32)
    arguments.add_argument("--new-tokens", type=int, default=64)
    arguments.add_argument("--tokenizer", type=Path, default=None)
    args = arguments.parse_args()
    logging.basicConfig(level=logging.WARNING)
    spec = RANDOM_SHAPES[args.shape]
    config = EngineConfig(
        model=f"random:{args.shape}",
        device=args.device,
        dtype="bfloat16" if args.device != "cpu" else "float32",
        max_num_seqs=args.batch,
        max_model_len=128 + args.new_tokens + 16,
        max_num_batched_tokens=max(4096, args.batch),
    )
    generator = torch.Generator().manual_seed(0)
    prompts = random_prompts(args.batch, 128, spec.vocab_size, generator)
    tokenizer = load_tokenizer(tokenizer_folder(args.tokenizer))
    with Engine(config) as engine:
        # a random shape has no tokenizer: its grammars use this one
        engine.worker.grammars = GrammarCompiler(tokenizer, [tokenizer.eos_token_id])
        decode_run(engine, prompts, args.new_tokens, True)  # warm-up: the grammar compiles, masks allocate
        result = alternate(
            args.rounds,
            lambda: decode_run(engine, prompts, args.new_tokens, False),
            lambda: decode_run(engine, prompts, args.new_tokens, True),
        )
    print(summary("decode, half the rows under a JSON schema:", result))
    write_results(
        args.json, {"device": device_name(args.device), "shape": args.shape, "batch": args.batch, **result}
    )


if __name__ == "__main__":
    main()
