"""Command line of MultiLoRA Studio.

Each subcommand is registered by a ``add_*_command`` function next to the code
that implements it; a subcommand is listed only once its capability exists.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from multilora_studio import __version__
from multilora_studio.bench.cli import add_bench_command
from multilora_studio.compare import add_compare_command
from multilora_studio.gui.command import add_gui_command
from multilora_studio.library_cli import add_library_commands
from multilora_studio.serve import add_serve_command

log = logging.getLogger("multilora_studio")


def add_model_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "model",
        help="prepare or describe the embedded default model",
        description="Convert the embedded default model (once) and show where it lives.",
    )
    parser.add_argument("action", choices=["prepare", "info"], nargs="?", default="info")
    parser.set_defaults(handler=run_model_command)


def run_model_command(args: argparse.Namespace) -> int:
    from multilora_studio.default_model import ensure_default_model

    folder = ensure_default_model(progress=print_progress)
    print(f"name:   {folder.name}")
    print(f"path:   {folder.path}")
    print(f"sha256: {folder.digest}")
    return 0


def print_progress(fraction: float, message: str) -> None:
    print(f"[{fraction * 100:5.1f}%] {message}", file=sys.stderr, flush=True)


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
    add_library_commands(subparsers)
    add_serve_command(subparsers)
    add_bench_command(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # no subcommand: open the window
        args = parser.parse_args([*(sys.argv[1:] if argv is None else argv), "gui"])
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
        log.debug("command failed", exc_info=True)
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
