"""What the commands share: engine flags and the EngineConfig they build, the base model
adapters are checked against, the library flags, the adapters a run names, progress and error printing.

The engine (torch) is imported by the functions that need it, not with this module: the
library's commands (``adapters list``) run without it.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from multilora_studio.adapters.adapter_config import DEFAULT_MAX_LORA_RANK
from multilora_studio.adapters.base_model import BaseModelRef
from multilora_studio.adapters.registry import Registry
from multilora_studio.cli.setting_flags import add_setting_flag, add_setting_flags, setting_values
from multilora_studio.demo import SKIP_ENV, demo_prompt_set, offer_demo_adapters

if TYPE_CHECKING:
    from multilora_studio.engine import Engine, EngineConfig

log = logging.getLogger("multilora_studio")

Subcommands = argparse._SubParsersAction  # what ``add_subparsers`` returns; argparse names no public type
DEMO_PROMPTS = "demo"  # --prompts demo: the demo adapters' example prompt set


def print_progress(fraction: float, message: str) -> None:
    print(f"[{fraction * 100:5.1f}%] {message}", file=sys.stderr, flush=True)


def print_error(error: BaseException, message: str) -> None:
    """A failed command's one line, ``message``, on stderr (the traceback goes to the debug log)."""
    log.debug("command failed", exc_info=error)
    print(f"error: {message}", file=sys.stderr)


# EngineConfig's flags that are not every engine command's: --model (serve takes several) and
# --batch-invariant (its default is the command's) are added their own way; bench and serve add
# the rest where they take them
NOT_SHARED = (
    "model",
    "batch_invariant",
    "max_num_seqs",
    "kv_cache_memory_gb",
    "adapter_loader",
    "adapter_load_workers",
)


def add_engine_arguments(
    parser: argparse.ArgumentParser, comparing: bool = False, several_models: bool = False
) -> None:
    """Engine flags shared by the commands that start an engine (vLLM names), from EngineConfig's
    declarations.

    ``comparing``: the command compares outputs across adapters (compare, eval), so its engine is
    batch-invariant unless ``--no-batch-invariant`` is given; a server's is not unless asked.
    ``several_models``: ``--model`` may be repeated (a list; ``engine_configs`` reads it).
    """
    from multilora_studio.engine import EngineConfig

    if several_models:
        from multilora_studio.deploy.base_settings import PER_BASE

        *others, last = PER_BASE
        parser.add_argument(
            "--model",
            action="append",
            default=None,
            metavar="FOLDER[,SETTING=VALUE...]",
            help="HF model folder (default: the embedded model); repeat to serve several base models, "
            "each with its own engine (the first takes --lora-modules); SETTING=VALUE after a folder "
            f"sets that base's own {', '.join(others)} or {last} (default: the flag's), e.g. --model "
            "/models/qwen,max-loras=4,kv-cache-gb=2",
        )
    else:
        add_setting_flag(parser, EngineConfig, "model")
    add_setting_flags(parser, EngineConfig, skip=NOT_SHARED)
    parser.add_argument(
        "--lora-modules", nargs="*", default=[], metavar="NAME=PATH", help="PEFT adapter folders to serve"
    )
    add_setting_flag(
        parser, EngineConfig, "batch_invariant", default=comparing or EngineConfig.batch_invariant
    )


def add_rank_argument(parser: argparse.ArgumentParser) -> None:
    """``--max-lora-rank`` of the library's commands, which run without the engine (torch): the one
    engine flag not made from its declaration (tests/test_cli_defaults.py checks that it reads the
    same)."""
    parser.add_argument(
        "--max-lora-rank",
        type=int,
        default=DEFAULT_MAX_LORA_RANK,
        help="largest adapter rank accepted (default: %(default)s)",
    )


def engine_configs(args: argparse.Namespace) -> list[EngineConfig]:
    """One EngineConfig per ``--model`` (``several_models``): the other flags shared, with the
    settings a ``--model FOLDER,SETTING=VALUE`` sets for its base (``parse_model``)."""
    from multilora_studio.deploy.base_settings import BaseSettings, parse_model

    configs = []
    for entry in args.model or [None]:
        model, own = parse_model(entry) if entry is not None else (None, BaseSettings())
        configs.append(own.apply(engine_config(args, model)))
    return configs


def engine_config(args: argparse.Namespace, model: str | None = None) -> EngineConfig:
    """The EngineConfig of the command's engine flags (``model`` instead of ``--model``)."""
    from multilora_studio.engine import EngineConfig

    values = setting_values(EngineConfig, args)
    values["model"] = model if model is not None else args.model
    return EngineConfig(**values)


def describe_base(model: str | None) -> BaseModelRef:
    """The base model adapters are checked against: a HF folder, or the embedded default model.

    Name and digest follow the engine's rule: the folder's name and the SHA-256 of its
    ``model.safetensors`` ("" for sharded weights).
    """
    from multilora_studio.engine.model.model_source import describe_model
    from multilora_studio.engine.model.model_spec import load_spec

    identity = describe_model(model, progress=print_progress)
    return BaseModelRef.of_spec(identity.name, identity.digest, load_spec(identity.folder))


def add_demo_adapters_flag(parser: argparse.ArgumentParser) -> None:
    """``--no-demo-adapters`` for the commands that offer the demo adapters at start."""
    parser.add_argument(
        "--no-demo-adapters",
        action="store_true",
        help="do not add the shipped demo adapters to the library at this start "
        f"(also: {SKIP_ENV}=1); they are added once, on the embedded model",
    )


def add_other_base_flag(parser: argparse.ArgumentParser) -> None:
    """``--allow-other-base`` for the commands that run library adapters on a base."""
    parser.add_argument(
        "--allow-other-base",
        action="store_true",
        help="use library adapters recorded against other base weights",
    )


def add_naming_arguments(parser: argparse.ArgumentParser) -> None:
    """``--name``, ``--alias`` and ``--notes`` of an adapter entering the library."""
    parser.add_argument("--name", default=None, help="library name (default: folder name / repo id)")
    parser.add_argument("--alias", action="append", default=[], help="another name for it (repeatable)")
    parser.add_argument("--notes", default="", help="free text kept with the adapter")
    parser.set_defaults(name_flag=True)  # flag_words: a name the library refuses points at --name


def add_base_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model`` and ``--max-lora-rank``: what an adapter entering the library is checked against."""
    parser.add_argument("--model", default=None, help="base model folder (default: the embedded model)")
    add_rank_argument(parser)


def library_for(adapters: Sequence[str], modules: dict[str, Path], offer_demo: bool) -> Registry | None:
    """The library, when an adapter is not among ``--lora-modules`` or the demo adapters are offered.

    ``adapters`` are the names a run asks for (without the base); one that is neither a
    ``--lora-modules`` entry nor in the library is refused with what to do.
    """
    from_library = [name for name in dict.fromkeys(adapters) if name not in modules]
    registry = Registry() if from_library or offer_demo else None
    if offer_demo and registry is not None:
        offer_demo_adapters(registry, lambda: describe_base(None))
    unknown = [name for name in from_library if registry is not None and registry.find(name) is None]
    if unknown:
        raise ValueError(
            f"unknown adapters {', '.join(unknown)}: not in the library (multilora-studio adapters "
            "list); give their folders with --lora-modules NAME=PATH"
        )
    return registry


def add_adapters(
    engine: Engine,
    adapters: Sequence[str],
    modules: dict[str, Path],
    registry: Registry | None,
    allow_other_base: bool,
) -> None:
    """Add each named adapter to ``engine``: from its ``--lora-modules`` folder, else from the library."""
    for name in dict.fromkeys(adapters):
        if name in modules:
            engine.add_adapter(name, modules[name])
        elif registry is not None:
            registry.load_into(engine, name, override=allow_other_base)


def prompt_set_file(text: str) -> Path:
    """``--prompts``: a file, or ``demo`` for the demo adapters' example prompt set."""
    return demo_prompt_set() if text == DEMO_PROMPTS else Path(text)


def check_fraction(value: float | None) -> float | None:
    """``--min-pass-rate`` checked: a fraction of prompts, 0 to 1."""
    if value is not None and not 0.0 <= value <= 1.0:
        raise ValueError(f"--min-pass-rate is a fraction of prompts from 0 to 1, got {value}")
    return value


def wait_for_stop_signal() -> None:
    """Block until Ctrl+C or SIGTERM."""
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
