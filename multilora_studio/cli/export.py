"""``multilora-studio export``: an adapter, or the model merged with it, as GGUF for llama.cpp
and Ollama."""

from __future__ import annotations

import argparse
from pathlib import Path

from multilora_studio.adapters.registry import Registry
from multilora_studio.cli.shared import Subcommands, print_progress

GGUF_KINDS = ("f32", "f16", "bf16", "q8_0")  # merge.gguf_model.GGUF_TYPES, named here without torch


def add_export_command(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "export",
        help="export an adapter, or the model merged with it, as GGUF for llama.cpp and Ollama",
        description="Write an adapter as a llama.cpp GGUF LoRA adapter (llama-cli --lora FILE), or with "
        "--merged the base merged with it as a GGUF model (f16, bf16, f32 or q8_0; other quantizations "
        "are llama.cpp's llama-quantize). An Ollama Modelfile is written beside the file (NAME.Modelfile: "
        "FROM, the chat template as TEMPLATE, stop tokens, and ADAPTER for an adapter); ollama create NAME "
        "-f NAME.Modelfile. The model card travels as the file's general.description. Families: llama, "
        "mistral, qwen2, qwen3, phi3, gemma2, gemma3.",
    )
    parser.add_argument("adapter", metavar="ADAPTER", help="library name or alias, or a PEFT adapter folder")
    parser.add_argument("--gguf", required=True, type=Path, metavar="OUT.gguf", help="the GGUF file to write")
    parser.add_argument(
        "--merged", action="store_true", help="merge the adapter into its base and write the model"
    )
    parser.add_argument(
        "--type",
        dest="kind",
        choices=GGUF_KINDS,
        default="f16",
        help="weights of a merged model (default: f16; an adapter is written in f32)",
    )
    parser.add_argument(
        "--into-base",
        default=None,
        metavar="BASE",
        help="base model folder or registered base name (default: the base the library validated it against)",
    )
    parser.add_argument(
        "--allow-other-base",
        action="store_true",
        help="export an adapter the library validated against other base weights",
    )
    parser.set_defaults(handler=run_export)


def run_export(args: argparse.Namespace) -> int:
    from multilora_studio.merge.gguf_export import QUANTIZE_HINT, export_adapter_gguf, export_merged_gguf
    from multilora_studio.merge.library_merge import resolve_merge_inputs

    inputs = resolve_merge_inputs(
        Registry(), [args.adapter], [1.0], args.into_base, args.allow_other_base, print_progress
    )
    if args.merged:
        result = export_merged_gguf(inputs, args.gguf, args.kind, print_progress)
        print(f"wrote {result.path} ({result.size_bytes / 1e6:.1f} MB, {args.kind})")
        print(QUANTIZE_HINT.format(path=result.path))
    else:
        result = export_adapter_gguf(inputs, args.gguf)
        size = f"{result.size_bytes / 1e6:.1f} MB"
        print(f"wrote {result.path} ({size}): llama-cli -m BASE.gguf --lora {result.path}")
    print(f"wrote {result.modelfile}: ollama create NAME -f {result.modelfile}")
    return 0
