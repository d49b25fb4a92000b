"""What the commands share: engine flags and the EngineConfig they build, the base model
adapters are checked against, the library flags, the adapters a run names, progress and error printing.

The engine (torch) is imported by the functions that need it, not with this module: the
library's commands (``adapters list``) run without it.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from multilora_studio.adapters.adapter_config import DEFAULT_MAX_LORA_RANK
from multilora_studio.adapters.base_model import BaseModelRef
from multilora_studio.adapters.registry import Registry
from multilora_studio.demo import SKIP_ENV, offer_demo_adapters

if TYPE_CHECKING:
    from multilora_studio.engine import Engine, EngineConfig

log = logging.getLogger("multilora_studio")

Subcommands = argparse._SubParsersAction  # what ``add_subparsers`` returns; argparse names no public type


def engine_default(name: str) -> Any:
    """EngineConfig's default of field ``name``: the one default the flags, the window and the API share."""
    from multilora_studio.engine import EngineConfig

    (item,) = (item for item in dataclasses.fields(EngineConfig) if item.name == name)
    return item.default


def print_progress(fraction: float, message: str) -> None:
    print(f"[{fraction * 100:5.1f}%] {message}", file=sys.stderr, flush=True)


def print_error(error: BaseException, message: str) -> None:
    """A failed command's one line, ``message``, on stderr (the traceback goes to the debug log)."""
    log.debug("command failed", exc_info=error)
    print(f"error: {message}", file=sys.stderr)


def add_engine_arguments(
    parser: argparse.ArgumentParser, comparing: bool = False, several_models: bool = False
) -> None:
    """Engine flags shared by the commands that start an engine (vLLM names).

    ``comparing``: the command compares outputs across adapters (compare, eval), so its engine is
    batch-invariant unless ``--no-batch-invariant`` is given; a server's is not unless asked.
    ``several_models``: ``--model`` may be repeated (a list; ``engine_configs`` reads it).
    """
    if several_models:
        parser.add_argument(
            "--model",
            action="append",
            default=None,
            metavar="FOLDER[,SETTING=VALUE...]",
            help="HF model folder (default: the embedded model); repeat to serve several base models, "
            "each with its own engine (the first takes --lora-modules); SETTING=VALUE after a folder "
            "sets that base's own max-loras, max-lora-rank, max-cpu-loras or kv-cache-gb "
            "(default: the flag's), e.g. --model /models/qwen,max-loras=4,kv-cache-gb=2",
        )
    else:
        parser.add_argument("--model", default=None, help="HF model folder (default: the embedded model)")
    add_device_arguments(parser)
    parser.add_argument(
        "--max-loras",
        type=int,
        default=engine_default("max_loras"),
        help="adapters resident on the device at once (default: %(default)s)",
    )
    add_rank_argument(parser)
    parser.add_argument(
        "--max-cpu-loras",
        type=int,
        default=engine_default("max_cpu_loras"),
        help="adapters kept in host RAM (default: as many as fit in --cpu-lora-memory-fraction of the "
        "free host memory, at least 2 x --max-loras)",
    )
    parser.add_argument(
        "--cpu-lora-memory-fraction",
        type=float,
        default=engine_default("cpu_lora_memory_fraction"),
        help="share of the free host memory the adapter tier may fill without --max-cpu-loras "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=engine_default("max_model_len"),
        help="prompt + output tokens per request (default: %(default)s)",
    )
    parser.add_argument(
        "--max-token-tables",
        type=int,
        default=engine_default("max_token_tables"),
        help="adapters with embed_tokens / lm_head tables (modules_to_save, trainable or added tokens) "
        "on the device at once (default: %(default)s)",
    )
    parser.add_argument(
        "--token-table-gb",
        type=float,
        default=engine_default("token_table_memory_gb"),
        help="device memory for those tables, reserved out of the KV cache (default: %(default)s)",
    )
    parser.add_argument(
        "--cpu-threads",
        type=int,
        default=engine_default("cpu_threads"),
        help="torch threads of the engine's steps on the CPU (default: one less than the usable cores)",
    )
    from multilora_studio.engine.quantization import QUANTIZATIONS

    parser.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        default=engine_default("quantization"),
        help="the base's quantization: fp8 serves an FP8 checkpoint or quantizes a float base to FP8 at "
        "load; awq / gptq expect such a checkpoint (default: as the checkpoint is)",
    )
    parser.add_argument(
        "--lora-modules", nargs="*", default=[], metavar="NAME=PATH", help="PEFT adapter folders to serve"
    )
    parser.add_argument(
        "--batch-invariant",
        action=argparse.BooleanOptionalAction,
        default=comparing or engine_default("batch_invariant"),
        help="a request's tokens do not depend on the rest of the batch or on prompt chunking "
        "(slower; default: %(default)s)",
    )


def add_device_arguments(parser: argparse.ArgumentParser) -> None:
    """``--device`` and ``--dtype`` with EngineConfig's defaults."""
    parser.add_argument(
        "--device", default=engine_default("device"), help="auto, cpu, cuda or cuda:N (default: %(default)s)"
    )
    parser.add_argument(
        "--dtype",
        default=engine_default("dtype"),
        help="auto, float32, bfloat16 or float16 (default: %(default)s)",
    )


def add_rank_argument(parser: argparse.ArgumentParser) -> None:
    """``--max-lora-rank`` with EngineConfig's default."""
    parser.add_argument(
        "--max-lora-rank",
        type=int,
        default=DEFAULT_MAX_LORA_RANK,
        help="largest adapter rank accepted (default: %(default)s)",
    )


def engine_configs(args: argparse.Namespace, kv_cache_memory_gb: float | None = None) -> list[EngineConfig]:
    """One EngineConfig per ``--model`` (``several_models``): the other flags shared, with the
    settings a ``--model FOLDER,SETTING=VALUE`` sets for its base (``parse_model``)."""
    from multilora_studio.deploy.base_settings import BaseSettings, parse_model

    configs = []
    for entry in args.model or [None]:
        model, own = parse_model(entry) if entry is not None else (None, BaseSettings())
        shared = dataclasses.replace(engine_config(args, model), kv_cache_memory_gb=kv_cache_memory_gb)
        configs.append(own.apply(shared))
    return configs


def engine_config(args: argparse.Namespace, model: str | None = None) -> EngineConfig:
    """The EngineConfig of ``add_engine_arguments``' flags (``model`` instead of ``--model``)."""
    from multilora_studio.engine import EngineConfig

    return EngineConfig(
        model=model if model is not None else args.model,
        device=args.device,
        dtype=args.dtype,
        max_loras=args.max_loras,
        max_lora_rank=args.max_lora_rank,
        max_cpu_loras=args.max_cpu_loras,
        cpu_lora_memory_fraction=args.cpu_lora_memory_fraction,
        max_model_len=args.max_model_len,
        batch_invariant=args.batch_invariant,
        max_token_tables=args.max_token_tables,
        token_table_memory_gb=args.token_table_gb,
        cpu_threads=args.cpu_threads,
        quantization=args.quantization,
    )


def describe_base(model: str | None) -> BaseModelRef:
    """The base model adapters are checked against: a HF folder, or the embedded default model.

    Name and digest follow the engine's rule: the folder's name and the SHA-256 of its
    ``model.safetensors`` ("" for sharded weights).
    """
    from multilora_studio.engine.model_source import describe_model
    from multilora_studio.engine.model_spec import load_spec

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


def add_naming_arguments(parser: argparse.ArgumentParser) -> None:
    """``--name``, ``--alias`` and ``--notes`` of an adapter entering the library."""
    parser.add_argument("--name", default=None, help="library name (default: folder name / repo id)")
    parser.add_argument("--alias", action="append", default=[], help="another name for it (repeatable)")
    parser.add_argument("--notes", default="", help="free text kept with the adapter")
    parser.set_defaults(name_flag=True)  # flag_words: "choose another name" can point at --name


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
