"""``multilora-studio merge``: merge adapters into their base and export a model folder, or
combine several adapters with weights into a new adapter."""

from __future__ import annotations

import argparse
from pathlib import Path

from multilora_studio.adapters.registry import Registry
from multilora_studio.cli.shared import Subcommands, print_progress
from multilora_studio.merge import COMBINATIONS, OUTPUT_DTYPES, MergeError, parse_shard_size
from multilora_studio.merge.library_merge import (
    MergeInputs,
    combine_into_library,
    merge_into_library,
    resolve_merge_inputs,
)


def add_merge_command(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "merge",
        help="merge adapters into their base model and export it (or combine adapters)",
        description="Merge an adapter into its base model's weights (W' = W + B A, in float32, cast "
        "once) and write a Hugging Face model folder: sharded safetensors with their index, "
        "config.json, the tokenizer, the generation config and a model card naming the base and "
        "the adapter. The merged model is registered as a base model of its own. Several adapters "
        "are first combined with --weights as PEFT's add_weighted_adapter does; with --as-adapter "
        "that combination is written as a new adapter and added to the library instead.",
    )
    parser.add_argument(
        "adapters", nargs="+", metavar="ADAPTER", help="library name or alias, or a PEFT adapter folder"
    )
    parser.add_argument(
        "--into-base",
        default=None,
        metavar="BASE",
        help="base model folder or registered base name (default: the base the adapter was "
        "validated against, if the library knows its folder, else the embedded model)",
    )
    parser.add_argument("--out", required=True, type=Path, help="the new folder to write")
    parser.add_argument(
        "--dtype", choices=sorted(OUTPUT_DTYPES), default=None, help="weights dtype (default: the base's)"
    )
    parser.add_argument(
        "--shard-size", default="5GB", help="largest safetensors file, e.g. 5GB, 500MB (default: 5GB)"
    )
    parser.add_argument(
        "--weights",
        default=None,
        help="comma-separated weight per adapter when combining several (default: 1 each)",
    )
    parser.add_argument(
        "--combination",
        choices=COMBINATIONS,
        default="linear",
        help="how several adapters combine: linear (one rank) or cat (ranks add; exact sum of deltas)",
    )
    parser.add_argument(
        "--as-adapter",
        action="store_true",
        help="write the combination of several adapters as a new adapter (added to the library)",
    )
    parser.add_argument("--name", default=None, help="library name of the result (default: the folder's)")
    parser.add_argument(
        "--allow-other-base",
        action="store_true",
        help="merge an adapter the library validated against other base weights",
    )
    parser.set_defaults(handler=run_merge)


def run_merge(args: argparse.Namespace) -> int:
    weights = _weights(args.weights, len(args.adapters))
    registry = Registry()
    inputs: MergeInputs = resolve_merge_inputs(
        registry, args.adapters, weights, args.into_base, args.allow_other_base, print_progress
    )
    if args.as_adapter:
        record = combine_into_library(registry, inputs, args.combination, args.out, args.name)
        print(f"combined {len(inputs.adapters)} adapters into {record.path}")
        print(f"added to the library as {record.name!r} (rank {record.rank})")
        return 0
    result, base = merge_into_library(
        registry,
        inputs,
        args.out,
        OUTPUT_DTYPES[args.dtype] if args.dtype else None,
        parse_shard_size(args.shard_size),
        args.combination,
        args.name,
        print_progress,
    )
    size_gb = result.total_bytes / 1e9
    print(f"wrote {result.path} ({len(result.files)} shard(s), {size_gb:.3f} GB, {result.dtype})")
    print(f"sha256: {result.digest}")
    print(f"registered as base model {base.repo_id!r}; serve it with: --model {result.path}")
    return 0


def _weights(text: str | None, count: int) -> list[float]:
    if text is None:
        return [1.0] * count
    try:
        weights = [float(part) for part in text.split(",")]
    except ValueError:
        raise MergeError(f"--weights {text!r}: give numbers separated by commas") from None
    if len(weights) != count:
        raise MergeError(f"--weights has {len(weights)} numbers for {count} adapters")
    return weights
