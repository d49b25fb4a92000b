"""One default per setting: the CLI's flags, the window's EngineChoice and EngineConfig agree (and
serve's flags ServerConfig, compare's the Compare view's RunSettings)."""

from __future__ import annotations

import argparse
import dataclasses
import inspect

import pytest

from multilora_studio.cli import build_parser
from multilora_studio.cli.setting_flags import add_setting_flag
from multilora_studio.cli.shared import add_rank_argument, engine_config
from multilora_studio.deploy import BasePool
from multilora_studio.engine import EngineConfig
from multilora_studio.gui.preferences import EngineChoice
from multilora_studio.run_records import RunSettings
from multilora_studio.server import ServerConfig

ENGINE = {item.name: item.default for item in dataclasses.fields(EngineConfig)}
SETTINGS = ("device", "dtype", "max_loras", "max_lora_rank", "max_cpu_loras", "max_model_len")
COMMANDS = {  # a command line that parses, and the engine settings it has flags for
    ("compare", "--prompt", "hi"): SETTINGS,
    ("serve",): SETTINGS,
    ("bench",): ("device", "dtype", "max_loras", "max_cpu_loras"),
    ("gui",): ("device",),
    ("adapters", "add", "folder"): ("max_lora_rank",),
    ("pull", "org/name"): ("max_lora_rank",),
}


def test_engine_config_has_the_settings_the_front_ends_share():
    assert set(SETTINGS) <= set(ENGINE)
    assert ENGINE["max_lora_rank"] == 16  # the smaller cap: on a GPU a larger one costs throughput


@pytest.mark.parametrize("argv", list(COMMANDS), ids=" ".join)
def test_cli_flags_default_to_engine_config(argv):
    args = build_parser().parse_args(list(argv))
    assert {name: getattr(args, name) for name in COMMANDS[argv]} == {
        name: ENGINE[name] for name in COMMANDS[argv]
    }


@pytest.mark.parametrize("command", ["compare", "serve"])
def test_batch_invariant_flag_reaches_the_engine_config(command):
    args = build_parser().parse_args(
        [command, "--batch-invariant", *(["--prompt", "hi"] if command == "compare" else [])]
    )
    assert engine_config(args) == EngineConfig(batch_invariant=True)


def test_an_engine_from_default_flags_is_the_default_engine_config():
    assert engine_config(build_parser().parse_args(["serve"])) == EngineConfig()


@pytest.mark.parametrize(
    "argv", [["compare", "--prompt", "hi"], ["eval", "--prompts", "set.jsonl", "--adapters", "base"]]
)
def test_commands_that_compare_outputs_run_batch_invariant_unless_told_not_to(argv):
    # like the window: a comparison must not depend on what else shared the batch
    assert engine_config(build_parser().parse_args(argv)) == EngineConfig(batch_invariant=True)
    off = build_parser().parse_args([*argv, "--no-batch-invariant"])
    assert engine_config(off) == EngineConfig()


def test_the_windows_defaults_are_engine_configs():
    choice = EngineChoice()
    for name in ("device", "dtype", "max_loras", "max_lora_rank"):
        assert getattr(choice, name) == ENGINE[name]
    assert choice.max_cpu_loras == 0 and ENGINE["max_cpu_loras"] is None  # both: sized from host memory
    # the one exception: the window compares outputs across batches, so it runs batch-invariant
    assert choice.batch_invariant and not ENGINE["batch_invariant"]
    assert choice.engine_config(None) == EngineConfig(batch_invariant=True)


def test_the_window_keeps_explicit_values():
    choice = EngineChoice(device="cpu", max_loras=3, max_lora_rank=32, max_cpu_loras=5, batch_invariant=False)
    config = choice.engine_config(None)
    assert (config.device, config.max_loras, config.max_lora_rank, config.max_cpu_loras) == ("cpu", 3, 32, 5)
    assert not config.batch_invariant


def test_serve_flags_default_to_server_config():
    args = build_parser().parse_args(["serve"])
    server = ServerConfig()
    flags = {
        "host": server.host,
        "port": server.port,
        "max_in_flight": server.max_in_flight,
        "max_sequences_per_request": server.max_sequences_per_request,
        "max_body_bytes": server.max_body_bytes,
        "hub_pull_timeout": server.hub_pull_timeout_s,
        "hub_pulls_at_once": server.hub_pulls_at_once,
        "hub_pull_limit": server.hub_pull_limit,
        "hub_pull_max_bytes": server.hub_pull_max_bytes,
        "header_timeout": server.header_timeout_s,
        "body_timeout": server.body_timeout_s,
        "max_connections_per_client": server.max_connections_per_client,
        "max_connections": server.max_connections,
    }
    assert {name: getattr(args, name) for name in flags} == flags
    assert args.base_load_timeout == inspect.signature(BasePool).parameters["load_timeout_s"].default


def test_compare_flags_default_to_the_compare_views_run_settings():
    args = build_parser().parse_args(["compare", "--prompt", "hi"])
    shared = RunSettings()
    assert (args.max_tokens, args.temperature, args.top_p) == (
        shared.max_tokens,
        shared.temperature,
        shared.top_p,
    )


def test_the_library_commands_rank_flag_reads_as_its_declaration():
    """``adapters add`` and ``pull`` build ``--max-lora-rank`` without the engine (torch): the same
    flag as the one made from EngineConfig's declaration."""
    library, engine = argparse.ArgumentParser(), argparse.ArgumentParser()
    add_rank_argument(library)
    add_setting_flag(engine, EngineConfig, "max_lora_rank")

    def described(parser: argparse.ArgumentParser) -> tuple:
        (action,) = (action for action in parser._actions if action.dest == "max_lora_rank")
        return action.option_strings, action.type, action.default, action.help, action.metavar

    assert described(library) == described(engine)
