"""``multilora-studio serve``: the OpenAI-compatible endpoint without the window (vLLM-style flags)."""

from __future__ import annotations

import argparse
import logging
import os
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

from multilora_studio.adapters.base_model import BaseModelRef
from multilora_studio.adapters.base_quantization import BaseQuantization, base_quantization_of
from multilora_studio.adapters.lora_modules import parse_lora_modules
from multilora_studio.adapters.registry import Registry
from multilora_studio.cli.serve_ray import add_ray_arguments, run_serve_ray
from multilora_studio.cli.setting_flags import add_setting_flag, add_setting_flags, setting_values
from multilora_studio.cli.shared import (
    Subcommands,
    add_demo_adapters_flag,
    add_engine_arguments,
    check_fraction,
    engine_configs,
    print_progress,
    wait_for_stop_signal,
)
from multilora_studio.demo import offer_demo_adapters
from multilora_studio.deploy import BasePool, parse_devices, start_engine
from multilora_studio.deploy.base_settings import check_kv_sizes
from multilora_studio.deploy.pool_settings import PoolSettings
from multilora_studio.engine import EngineConfig, ServingEngine
from multilora_studio.engine.model.model_source import RANDOM_PREFIX
from multilora_studio.engine.serving_engine import metrics_of
from multilora_studio.engine.step.device_setup import resolve_device
from multilora_studio.server.config import ServerConfig

if TYPE_CHECKING:
    from multilora_studio.server.api_keys import ApiKey

log = logging.getLogger(__name__)

API_KEY_ENV = "MULTILORA_STUDIO_API_KEY"


def add_serve_command(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve the base model and adapters over an OpenAI-compatible HTTP API",
        description="Serve the base model and its LoRA adapters (--lora-modules and the adapter "
        "library) over an OpenAI-compatible HTTP API; the request's `model` field picks the adapter. "
        "Stop with Ctrl+C.",
    )
    add_engine_arguments(parser, several_models=True)
    add_setting_flags(parser, PoolSettings)
    add_setting_flag(
        parser,
        EngineConfig,
        "kv_cache_memory_gb",
        help="KV cache of each base model's engine (needed on a GPU with several --model, so that "
        "they share its memory; default: the engine's sizing)",
    )
    parser.add_argument(
        "--no-library",
        action="store_true",
        help="serve only --lora-modules, not the adapters of the library",
    )
    parser.add_argument(
        "--min-pass-rate",
        type=float,
        default=None,
        metavar="FRACTION",
        help="the quality gate: do not serve a library adapter whose newest evaluation passed fewer "
        "than this fraction of its prompts (0-1; adapters never evaluated are served)",
    )
    add_demo_adapters_flag(parser)
    add_setting_flag(parser, ServerConfig, "host")
    add_setting_flag(parser, ServerConfig, "port")
    parser.add_argument(
        "--api-key",
        action="append",
        default=None,
        help=f"require this bearer key, an admin key: every route (repeatable; default: ${API_KEY_ENV}, "
        "comma-separated). Every local account can read it in the process list (ps): prefer "
        f"--keys-file or ${API_KEY_ENV}",
    )
    parser.add_argument(
        "--user-key",
        action="append",
        default=[],
        metavar="KEY",
        help="a bearer key that may only generate (no adapter loading, unloading or metrics); repeatable. "
        "Visible in the process list, as --api-key: prefer --keys-file",
    )
    parser.add_argument(
        "--keys-file",
        default=None,
        metavar="FILE",
        help='JSON list of keys: {"key" or "key_env", "role": "user"|"admin", "models": [patterns], '
        '"name"}; readable by you only',
    )
    add_setting_flags(parser, ServerConfig, skip=("host", "port"))
    add_ray_arguments(parser)
    parser.set_defaults(handler=run_serve)


def api_keys(args: argparse.Namespace) -> tuple[str | ApiKey, ...]:
    """--api-key (else $MULTILORA_STUDIO_API_KEY), --user-key and --keys-file; an empty key is an error."""
    from multilora_studio.server.api_keys import USER, ApiKey, read_keys_file

    if args.api_key is not None:
        given, source = args.api_key, "--api-key"
    elif API_KEY_ENV in os.environ:
        given, source = os.environ[API_KEY_ENV].split(","), f"${API_KEY_ENV}"
    else:
        given, source = [], ""
    for keys, where in ((given, source), (args.user_key, "--user-key")):
        if any(not key.strip() for key in keys):
            raise ValueError(f"{where} holds an empty key: authentication would be off; give a key")
    if args.api_key is not None or args.user_key:
        log.warning(
            "keys given with --api-key or --user-key can be read by every local account in the process "
            "list (ps); use --keys-file (readable by you only) or $%s instead",
            API_KEY_ENV,
        )
    admin: list[str | ApiKey] = [key.strip() for key in given]
    users = [ApiKey(key.strip(), USER) for key in args.user_key]
    from_file = read_keys_file(args.keys_file) if args.keys_file else ()
    return (*admin, *users, *from_file)


def serve_library(
    pool: BasePool, demo_adapters: bool = True, min_pass_rate: float | None = None
) -> list[str]:
    """Serve the library's active adapters next to those already served, each on the base whose
    weights it was validated against and under its aliases (``ModelAliases.add_record``), and
    read the warm ones into host RAM; returns the names added. ``min_pass_rate``: the quality
    gate (``Registry.served_records``).

    First offers the demo adapters (``offer_demo_adapters``: once per library, on their base
    model) to the first base, when it is loaded, unless ``demo_adapters`` is off. An adapter
    of no served base's weights, or whose name is already served (``--lora-modules``), is
    skipped with a log line; the weights are read on first use. A library that cannot be
    opened is logged and skipped.
    """
    try:
        registry = Registry()
    except (OSError, sqlite3.Error, ValueError) as error:
        log.warning("serving without the adapter library: %s", error)
        return []
    resident = dict(pool.resident())
    if demo_adapters and pool.primary in resident:
        offer_demo_adapters(registry, BaseModelRef.of_engine(resident[pool.primary]))
    digests = {name: pool.base(name).digest for name in pool.names}
    quantizations = {name: pool_base_quantization(pool.base(name).config) for name in pool.names}
    added = []
    warm: dict[str, list[str]] = {}
    for record in registry.served_records(min_pass_rate):
        if pool.base_of(record.name) is not None:
            log.info("library adapter %s not served: another model uses that name", record.name)
            continue
        status = {n: record.base_status(d, quantizations[n]) for n, d in digests.items()}
        base = next((n for n in digests if status[n] == "ok"), None)
        if base is None:  # a quantized version of its base serves it; the library says so
            base = next((n for n in digests if status[n] == "quantized"), None)
            quantization = quantizations[base] if base is not None else None
            if base is not None and quantization is not None:
                log.info("%s", registry.note_serving(record, base, digests[base], quantization))
        if base is None:
            log.info(
                "library adapter %s not served: no base model served has its base's weights", record.name
            )
            continue
        try:
            pool.register_adapter(base, record.name, record.path, pinned=record.pinned)
        except (ValueError, OSError) as error:
            log.info("library adapter %s not served: %s", record.name, error)
        else:
            added.append(record.name)
            if record.warm:
                warm.setdefault(base, []).append(record.name)
            pool.aliases.add_record(record)
    for base, engine in pool.resident():
        snapshot = metrics_of(engine, fresh=True)
        # the host tier holds this many: the first ones (a Ray deployment's LRU takes them all)
        room = snapshot.cpu_capacity if snapshot is not None else len(warm.get(base, []))
        for name, failure in engine.prefetch_adapters(warm.get(base, [])[:room]).items():
            if failure is not None:
                log.warning("warm adapter %s not read: %s", name, failure)
    return added


def pool_base_quantization(config: EngineConfig) -> BaseQuantization | None:
    """The quantization a pool base's engine will serve (its folder's, or ``--quantization``)."""
    model = config.model
    folder = Path(model).expanduser() if model is not None and not model.startswith(RANDOM_PREFIX) else None
    return base_quantization_of(folder, config.quantization)


def run_serve(args: argparse.Namespace) -> int:
    from multilora_studio.server import ApiServer, bind_socket

    min_pass_rate = check_fraction(args.min_pass_rate)  # refused before anything starts

    config = ServerConfig(**setting_values(ServerConfig, args), api_keys=api_keys(args))
    pool_settings = PoolSettings(**setting_values(PoolSettings, args))
    if args.ray:
        return run_serve_ray(args, config)
    modules = parse_lora_modules(args.lora_modules)
    if not config.loopback:
        print(f"Host header checked against: {', '.join(config.host_names())}", flush=True)
        if not config.api_keys:
            log.warning("serving on %s without an API key: anyone who can reach it can use it", config.host)
    configs = engine_configs(args)
    devices = parse_devices(pool_settings.devices) if pool_settings.devices is not None else None
    first_device = devices[0] if devices is not None else configs[0].device
    on_gpu = resolve_device(first_device).type == "cuda"
    check_kv_sizes(configs, on_gpu)
    listener = bind_socket(config.host, config.port)  # a busy port fails now, not after the model loads
    try:
        with start_pool(configs, pool_settings, devices) as pool:
            for name, path in modules.items():
                pool.add_adapter(pool.primary, name, path)
            if not args.no_library:
                serve_library(pool, not args.no_demo_adapters, min_pass_rate)
            server = ApiServer(pool, config)
            url = server.start(sock=listener)
            names = [name for base in pool.names for name in (base, *sorted(pool.adapters_of(base)))]
            print(f"serving {', '.join(names)} at {url}/v1", flush=True)
            wait_for_stop_signal()
            server.stop()
    finally:
        listener.close()
    return 0


def start_pool(configs: list[EngineConfig], settings: PoolSettings, devices: list[str] | None) -> BasePool:
    """The bases to serve (each on ``devices``, else its own device), the first
    ``max_resident_bases`` of them started now."""
    resident = settings.max_resident_bases or len(configs)

    def start(config: EngineConfig) -> ServingEngine:
        return start_engine(config, devices, settings.dispatch_margin, print_progress)

    started: list[ServingEngine] = []
    try:
        for config in configs[:resident]:
            started.append(start(config))
        return BasePool(
            configs,
            max_resident=settings.max_resident_bases,
            keep_alive_s=settings.keep_alive,
            load_timeout_s=settings.base_load_timeout,
            engine_factory=start,
            started=started,
        )
    except BaseException:
        for engine in started:
            engine.shutdown()
        raise
