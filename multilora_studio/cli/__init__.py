"""Command line of MultiLoRA Studio: ``main`` and the parser of every command.

Each command is one module of this package (named as the command) with an
``add_<command>_command`` function that registers it; what several commands share is in
``shared``. A command is listed only once its capability exists. A command line imports only
its command's module: the library's commands and ``--help`` run without torch, Qt or FastAPI.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Collection, Sequence

from multilora_studio import __version__
from multilora_studio.cli.defaults_file import DefaultsFileError, apply_defaults, long_flags
from multilora_studio.cli.flag_words import in_flag_words, typed_flags
from multilora_studio.cli.shared import print_error
from multilora_studio.paths import command_defaults_path

PIPE_CLOSED = 141  # 128 + SIGPIPE: what a tool stopped by a closed pipe returns
DEFAULT_COMMAND = "gui"
# Each command and its line in ``multilora-studio --help`` (its module's add_parser help, the
# same text: a test compares them), in the order listed.
COMMANDS = {
    "gui": "open the desktop window (the default command)",
    "model": "prepare or describe the embedded default model",
    "compare": "run one prompt through several adapters in one batch",
    "eval": "evaluate adapters on your own prompt set",
    "watch": "follow a training run: import, score and compare its checkpoints as they appear",
    "arena": "vote blind between two adapters' answers, and rank adapters by the votes",
    "pull": "pull an adapter (or a base model) from the Hugging Face Hub",
    "adapters": "list, add, remove, pin and inspect the adapters of the library",
    "drift": "measure how far an adapter's outputs move when its base is served quantized",
    "merge": "merge adapters into their base model and export it (or combine adapters)",
    "export": "export an adapter, or the model merged with it, as GGUF for llama.cpp and Ollama",
    "serve": "serve the base model and adapters over an OpenAI-compatible HTTP API",
    "bench": "benchmark the engine (or an endpoint) on the Punica and S-LoRA workloads",
    "advise": "recommend max_loras, max_cpu_loras, pins and merges from a server's recorded traffic",
}


def build_parser(commands: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of ``commands`` only (the others listed by their help
    line, their modules not imported)."""
    parser = argparse.ArgumentParser(
        prog="multilora-studio",
        description="Serve and compare many LoRA adapters of one base model, batched on one GPU.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command, line in COMMANDS.items():
        if commands is None or command in commands:
            module = importlib.import_module(f"{__name__}.{command}")
            getattr(module, f"add_{command}_command")(subparsers)
        else:
            subparsers.add_parser(command, help=line)
    return parser


def command_of(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names (the first word that is not an option: the top-level options
    take no value), ``DEFAULT_COMMAND`` for none, None for ``--help`` / ``--version`` or an
    unknown word (the parser then answers without any command's module)."""
    for word in argv:
        if word in ("-h", "--help", "--version"):
            return None
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return DEFAULT_COMMAND


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
    command = command_of(argv)
    parser = build_parser(() if command is None else (command,))
    try:
        apply_defaults(parser, command_defaults_path(), lambda: long_flags(build_parser()))
    except DefaultsFileError as error:
        print_error(error, str(error))
        return 2
    args = parser.parse_args(argv)
    if args.command is None:  # no subcommand: open the window
        args = parser.parse_args([*argv, DEFAULT_COMMAND])
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
        print_error(error, in_flag_words(error, args, typed_flags(argv)))
        return 1


__all__ = ["build_parser", "main"]
