"""``multilora-studio compare``: one prompt through several adapters (and the base) in one batched run."""

from __future__ import annotations

import argparse
import json
import shutil
import textwrap

from multilora_studio.adapters.lora_modules import parse_lora_modules
from multilora_studio.cli.shared import (
    Subcommands,
    add_adapters,
    add_demo_adapters_flag,
    add_engine_arguments,
    add_other_base_flag,
    engine_config,
    library_for,
    print_progress,
)
from multilora_studio.engine import Engine, RequestOutput, SamplingParams
from multilora_studio.invalid_setting import InvalidSetting
from multilora_studio.run_records import BASE, RunSettings


def add_compare_command(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "compare",
        help="run one prompt through several adapters in one batch",
        description="Run one prompt through several adapters and the base model in ONE batched run "
        "and print the answers side by side.",
    )
    parser.add_argument("--prompt", required=True, help="the prompt (a user message unless --raw)")
    parser.add_argument(
        "--adapters", default=BASE, help=f"comma-separated adapter names; '{BASE}' is the base model"
    )
    parser.add_argument("--raw", action="store_true", help="send the prompt as plain text, not as chat")
    shared = RunSettings()  # the Compare view's defaults too
    parser.add_argument(
        "--max-tokens", type=int, default=shared.max_tokens, help="new tokens per answer at most"
    )
    parser.add_argument(
        "--temperature", type=float, default=shared.temperature, help="0: greedy (the same answer every run)"
    )
    parser.add_argument(
        "--top-p", type=float, default=shared.top_p, help="nucleus sampling: keep this much probability"
    )
    parser.add_argument("--seed", type=int, default=None, help="seed of the sampling (default: the engine's)")
    parser.add_argument(
        "--layout", choices=["columns", "rows"], default=None, help="default: fit the terminal"
    )
    parser.add_argument("--json", action="store_true", help="print the outputs as JSON")
    add_other_base_flag(parser)
    add_engine_arguments(parser, comparing=True)
    add_demo_adapters_flag(parser)
    parser.set_defaults(handler=run_compare)


def run_compare(args: argparse.Namespace) -> int:
    modules = parse_lora_modules(args.lora_modules)
    choices = [name.strip() for name in args.adapters.split(",") if name.strip()]
    if not choices:
        raise ValueError("--adapters names at least one adapter or 'base'")
    offer = args.model is None and not args.no_demo_adapters  # the demo adapters are for the embedded model
    adapter_names = [name for name in choices if name != BASE]
    registry = library_for(adapter_names, modules, offer)
    if args.max_tokens < 1:  # the engine takes 0 (the prompt only); a comparison needs an answer
        raise InvalidSetting.of("max_tokens", args.max_tokens, "must be >= 1, got {value}")
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed
    )
    with Engine(engine_config(args), progress=print_progress) as engine:
        add_adapters(engine, adapter_names, modules, registry, args.allow_other_base)
        prompt = args.prompt if args.raw else [{"role": "user", "content": args.prompt}]
        adapters = [None if name == BASE else name for name in choices]
        outputs = engine.generate([prompt] * len(choices), adapters, params)
        model_name = engine.model_name
    if args.json:
        print(json.dumps([output_record(n, o) for n, o in zip(choices, outputs, strict=True)], indent=2))
    else:
        print(f"model: {model_name}   prompt: {args.prompt!r}\n")
        print(render(choices, outputs, args.layout))
    return 0


def output_record(name: str, output: RequestOutput) -> dict:
    return {
        "adapter": name,
        "text": output.text,
        "tokens": len(output.token_ids),
        "finish_reason": output.finish_reason,
        "ttft_s": output.ttft,
        "tokens_per_second": output.tokens_per_second,
    }


def header(name: str, output: RequestOutput) -> str:
    rate = output.tokens_per_second
    speed = f"{rate:.1f} tok/s" if rate else "-"
    return f"{name} ({len(output.token_ids)} tok, {speed})"


def render(names: list[str], outputs: list[RequestOutput], layout: str | None) -> str:
    """Columns when they fit the terminal (at least 28 characters each), rows otherwise."""
    width = shutil.get_terminal_size((120, 40)).columns
    column = (width - 3 * (len(names) - 1)) // max(1, len(names))
    if layout == "rows" or (layout is None and column < 28):
        blocks = [f"== {header(n, o)}\n{o.text.strip()}" for n, o in zip(names, outputs, strict=True)]
        return "\n\n".join(blocks)
    wrapped = [
        [header(n, o)[:column], "-" * column, *textwrap.wrap(o.text.strip(), column)]
        for n, o in zip(names, outputs, strict=True)
    ]
    height = max(len(lines) for lines in wrapped)
    rows = []
    for row in range(height):
        cells = [(lines[row] if row < len(lines) else "").ljust(column) for lines in wrapped]
        rows.append(" | ".join(cells).rstrip())
    return "\n".join(rows)
