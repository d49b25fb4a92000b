"""``watch RUN_DIR``: follow a training run's output folder, import each checkpoint as it is
written, score it on the run's prompt set and move ``RUN@latest`` / ``RUN@best``
(``runs/follower.py``)."""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from multilora_studio.adapters.registry import Registry
from multilora_studio.cli.shared import (
    Subcommands,
    add_engine_arguments,
    describe_base,
    engine_config,
    print_progress,
    prompt_set_file,
)

if TYPE_CHECKING:  # the runs package imports the engine (torch): only when a run is followed
    from multilora_studio.engine import Engine
    from multilora_studio.runs import RunFollower, RunUpdate
    from multilora_studio.server import ApiServer

DEFAULT_INTERVAL_S = 5.0


def add_watch_command(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "watch",
        help="follow a training run: import, score and compare its checkpoints as they appear",
        description="Poll a training output folder (HF Trainer, TRL, axolotl, Unsloth: checkpoint-N/ "
        "folders with a PEFT adapter and trainer_state.json, the final adapter in the folder itself) "
        "and import each checkpoint once its files are whole as RUN@step-N, with its training and "
        "evaluation losses. With --prompts each checkpoint is scored on the prompt set, and RUN@best "
        "names the checkpoint with the best mean score (moved only when a checkpoint beats it by more "
        "than the spread over the prompts); RUN@latest names the newest. Stop with Ctrl+C; the run "
        "resumes where it was at the next watch with the same name.",
    )
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the trainer's output folder")
    parser.add_argument("--name", default=None, help="the run's name (default: the folder's name)")
    parser.add_argument(
        "--prompts",
        type=prompt_set_file,
        default=None,
        help="prompt set (.jsonl or .csv) each checkpoint is scored on (default: the run's, if it had one)",
    )
    parser.add_argument(
        "--follow-deletions",
        action="store_true",
        help="retire a checkpoint whose folder the trainer deletes (save_total_limit); the library "
        "keeps its copy either way",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL_S,
        help="seconds between polls of the folder (default: %(default)s)",
    )
    parser.add_argument(
        "--exit-when-idle",
        action="store_true",
        help="stop once every checkpoint written so far is imported and scored (for scripts)",
    )
    parser.add_argument(
        "--max-tokens", type=int, default=16, help="new tokens per scored answer (default: %(default)s)"
    )
    parser.add_argument(
        "--serve",
        action="store_true",
        help="also serve the run's checkpoints over the OpenAI-compatible API on 127.0.0.1 (the "
        "model RUN@latest, RUN@best or RUN@step-N), each as soon as it is imported",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=8000,
        help="with --serve: the TCP port (0: any free port; default: %(default)s)",
    )
    add_engine_arguments(parser, comparing=True)
    parser.set_defaults(handler=run_watch)


def run_watch(args: argparse.Namespace) -> int:
    from multilora_studio.evaluate import EvalSettings
    from multilora_studio.runs import RunFollower

    if args.interval <= 0:
        raise ValueError(f"--interval is a number of seconds above 0, got {args.interval:g}")
    folder = args.run_dir.expanduser().resolve()
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder")
    name = args.name or folder.name
    registry = Registry()
    registry.check_run(name, folder)  # before the base is read
    known = {run.name: run for run in registry.runs()}
    scored = args.prompts is not None or bool(name in known and known[name].prompt_set)
    settings = EvalSettings(max_tokens=args.max_tokens)
    if not scored and not args.serve:
        follower = RunFollower(registry, describe_base(args.model), follow_deletions=args.follow_deletions)
        return follow(follower, name, folder, args)
    from multilora_studio.adapters.base_model import BaseModelRef
    from multilora_studio.engine import Engine

    with Engine(engine_config(args), progress=print_progress) as engine:
        follower = RunFollower(
            registry,
            BaseModelRef.of_engine(engine),
            engine=engine,
            settings=settings,
            follow_deletions=args.follow_deletions,
        )
        if not args.serve:
            return follow(follower, name, folder, args)
        with serving(engine, args.port) as server:
            follower.aliases = server.pool.aliases
            return follow(follower, name, folder, args, served=True)


@contextlib.contextmanager
def serving(engine: Engine, port: int) -> Iterator[ApiServer]:
    """An API server on 127.0.0.1:``port`` over ``engine`` while the block runs."""
    from multilora_studio.server import ApiServer, ServerConfig

    server = ApiServer(engine, ServerConfig(port=port))
    server.start()
    print(f"serving on {server.url}/v1", flush=True)
    try:
        yield server
    finally:
        server.stop()


def follow(
    follower: RunFollower, name: str, folder: Path, args: argparse.Namespace, served: bool = False
) -> int:
    """Poll until Ctrl+C, SIGTERM or (``--exit-when-idle``) nothing is left to do; ``served``:
    the run's checkpoints imported before are served too."""
    prompt_set = args.prompts
    if prompt_set is None:
        known = {run.name: run for run in follower.registry.runs()}
        prompt_set = Path(known[name].prompt_set) if name in known and known[name].prompt_set else None
    follower.follow(name, folder, prompt_set)
    if served and follower.engine is not None:
        follower.serve_run(name, follower.engine)
    print(f"watching {folder} as run {name!r} every {args.interval:g} s (Ctrl+C stops)", flush=True)
    stop = threading.Event()
    with stop_on_signal(stop.set):
        idle, said = 0, None
        while True:
            (update,) = follower.poll()
            for line in describe(update):
                print(line, flush=True)
            if update.error is not None and update.error != said:
                print(f"checkpoints not scored: {update.error}", flush=True)
                said = update.error
            busy = update.polled.waiting or update.polled.imported or update.scored
            idle = 0 if busy else idle + 1
            if args.exit_when_idle and idle >= 2 and not pending_scores(follower, name):
                return 0
            if stop.wait(args.interval):
                return 0


def pending_scores(follower: RunFollower, name: str) -> bool:
    """Whether a checkpoint still waits for its scores (never, without an engine or prompt set)."""
    if not follower.scores(name):
        return False
    return any(c.scores is None and c.present for c in follower.registry.checkpoints(name))


def describe(update: RunUpdate) -> list[str]:
    """One line per thing a poll did."""
    lines = []
    for checkpoint in update.polled.imported:
        losses = [
            f"{label} {value:.4f}"
            for label, value in (("loss", checkpoint.train_loss), ("eval loss", checkpoint.eval_loss))
            if value is not None
        ]
        suffix = f" ({', '.join(losses)})" if losses else ""
        lines.append(f"imported {checkpoint.folder.name} as {checkpoint.adapter}{suffix}")
    for checkpoint in update.polled.gone:
        lines.append(f"{checkpoint.folder} was deleted; the library keeps {checkpoint.adapter}")
    for path, why in update.polled.refused:
        lines.append(f"not imported: {path}: {why}")
    if update.scored:
        lines.append(f"scored {', '.join(update.scored)}")
    if update.best_moved and update.best is not None:
        best = update.best
        lines.append(
            f"{update.run}@best -> {best.checkpoint.adapter} "
            f"(mean {best.checkpoint.metric} {best.mean:.4f} ± {best.spread:.4f})"
        )
    return lines


@contextlib.contextmanager
def stop_on_signal(stop: Callable[[], None]) -> Iterator[None]:
    """Call ``stop`` on SIGTERM and Ctrl+C while the block runs (the previous handlers after)."""
    previous = {
        number: signal.signal(number, lambda *_: stop()) for number in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
