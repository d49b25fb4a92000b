"""``drift NAME``: how far an adapter's next-token distributions move when its base
is served quantized (``evaluate/quant_drift.py``), printed and kept in the adapter's audit log,
where the Library's details show it."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from multilora_studio.adapters.adapter_tokenizer import load_tokenizer
from multilora_studio.adapters.registry import Registry
from multilora_studio.cli.shared import Subcommands, add_engine_arguments, engine_config


def add_drift_command(subparsers: Subcommands) -> None:
    drift = subparsers.add_parser(
        "drift",
        help="measure how far an adapter's outputs move when its base is served quantized",
        description="Score a fixed set of texts with the adapter on its float base (--model) and on a "
        "quantized one: the same checkpoint quantized at load (--quantization fp8 or int4) or a "
        "quantized checkpoint of the same model (--quantized-model); print the mean KL divergence and "
        "top-1 agreement of their next-token distributions and keep them in the adapter's audit log.",
    )
    drift.add_argument("name", help="adapter name or alias")
    drift.add_argument(
        "--quantized-model",
        type=Path,
        default=None,
        help="a quantized checkpoint (AWQ, GPTQ, FP8) of --model",
    )
    add_engine_arguments(drift)
    drift.set_defaults(handler=run_drift)


def run_drift(args: argparse.Namespace) -> int:
    from multilora_studio.default_model import ensure_default_model
    from multilora_studio.evaluate.quant_drift import measure_drift

    registry = Registry()
    record = registry.get(args.name)
    asked = engine_config(args)
    folder = Path(asked.model) if asked.model is not None else ensure_default_model().path
    float_config = dataclasses.replace(asked, model=str(folder), quantization=None)
    if args.quantized_model is not None:
        quantized = dataclasses.replace(float_config, model=str(args.quantized_model))
        label = f"{args.quantized_model.name} (as the checkpoint is quantized)"
    elif asked.quantization in ("fp8", "int4"):
        quantized = dataclasses.replace(float_config, quantization=asked.quantization)
        label = f"{folder.name} quantized at load to {asked.quantization}"
    else:
        raise ValueError(
            "give --quantization fp8 or int4, or --quantized-model FOLDER, for the quantized base"
        )
    drift = measure_drift(float_config, quantized, load_tokenizer(folder), record.path)
    measured = f"on {label} against {folder.name}: {drift.describe()}"
    registry.record_quant_drift(record.name, measured)
    print(f"{record.name}: {measured}")
    return 0
