"""Command line of MultiLoRA Studio: ``main`` and the parser of every command.

Each command is one module of this package with an ``add_*_command`` function that
registers it; what several commands share is in ``shared``. A command is listed only
once its capability exists.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from multilora_studio import __version__
from multilora_studio.cli.adapters import add_adapters_command
from multilora_studio.cli.advise import add_advise_command
from multilora_studio.cli.bench import add_bench_command
from multilora_studio.cli.compare import add_compare_command
from multilora_studio.cli.eval import add_eval_command
from multilora_studio.cli.flag_words import in_flag_words, typed_flags
from multilora_studio.cli.gui import add_gui_command
from multilora_studio.cli.merge import add_merge_command
from multilora_studio.cli.model import add_model_command
from multilora_studio.cli.pull import add_pull_command
from multilora_studio.cli.serve import add_serve_command
from multilora_studio.cli.shared import print_error

PIPE_CLOSED = 141  # 128 + SIGPIPE: what a tool stopped by a closed pipe returns


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="multilora-studio",
        description="Serve and compare many LoRA adapters of one base model, batched on one GPU.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_gui_command(subparsers)
    add_model_command(subparsers)
    add_compare_command(subparsers)
    add_eval_command(subparsers)
    add_pull_command(subparsers)
    add_adapters_command(subparsers)
    add_merge_command(subparsers)
    add_serve_command(subparsers)
    add_bench_command(subparsers)
    add_advise_command(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command line; a closed stdout (``... | head -1``) ends it quietly with 141."""
    try:
        try:
            return run_command(list(sys.argv[1:] if argv is None else argv))
        finally:
            sys.stdout.flush()  # a closed pipe fails here (after --help's SystemExit too), not at exit
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush succeeds
        return PIPE_CLOSED


def run_command(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # no subcommand: open the window
        args = parser.parse_args([*argv, "gui"])
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return int(handler(args))
    except KeyboardInterrupt:
        return 130
    except (ValueError, FileNotFoundError, RuntimeError) as error:
        print_error(error, in_flag_words(str(error), args, typed_flags(argv)))
        return 1


__all__ = ["build_parser", "main"]
