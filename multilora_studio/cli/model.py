"""``multilora-studio model``: convert the embedded default model (once) and show where it lives."""

from __future__ import annotations

import argparse

from multilora_studio.cli.shared import Subcommands, print_progress
from multilora_studio.default_model import ensure_default_model


def add_model_command(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "model",
        help="prepare or describe the embedded default model",
        description="Convert the embedded default model (once) and show where it lives.",
    )
    parser.add_argument(
        "action",
        choices=["prepare", "info"],
        nargs="?",
        default="info",
        help="both convert the model if it never was, then print its name, folder and digest",
    )
    parser.set_defaults(handler=run_model_command)


def run_model_command(args: argparse.Namespace) -> int:
    folder = ensure_default_model(progress=print_progress)
    print(f"name:   {folder.name}")
    print(f"path:   {folder.path}")
    print(f"sha256: {folder.digest}")
    return 0
