"""The CLI's errors name the flags the user typed, and every flag a message suggests exists."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import pytest

from multilora_studio.adapters.registry import Registry
from multilora_studio.cli import build_parser, main
from multilora_studio.cli.flag_words import flags, in_flag_words
from multilora_studio.cli.reference import commands
from multilora_studio.cli.shared import describe_base
from multilora_studio.deploy.pool_settings import PoolSettings
from multilora_studio.engine import EngineConfig
from multilora_studio.engine.settings import declared
from multilora_studio.invalid_setting import InvalidSetting
from multilora_studio.server.config import ServerConfig

PACKAGE = Path(__file__).resolve().parents[1] / "multilora_studio"
OWN_PARSERS = {PACKAGE / "demo" / "train_demo_adapters.py"}  # a script with a parser of its own
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
OTHER_TOOLS = ("pip ", "llama-cli ", "llama.cpp --")  # strings whose flags are other programs'


def error_of(capsys: pytest.CaptureFixture, *argv: str) -> str:
    assert main(list(argv)) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    return err.removeprefix("error: ").strip()


def compare_error(capsys: pytest.CaptureFixture, *flags: str) -> str:
    return error_of(capsys, "compare", "--prompt", "hi", "--no-demo-adapters", *flags)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-cpu-loras", "1"], "--max-cpu-loras (1) must be >= --max-loras (8, the default)"),
        (["--max-loras", "4", "--max-cpu-loras", "2"], "--max-cpu-loras (2) must be >= --max-loras (4)"),
        (["--max-loras=4", "--max-cpu-loras=2"], "--max-cpu-loras (2) must be >= --max-loras (4)"),
        (["--max-loras", "0"], "--max-loras must be between 1 and 1024, got 0"),
        (["--max-lora-rank", "1024"], "--max-lora-rank must be between 1 and 512, got 1024"),
        (["--max-model-len", "8"], "--max-model-len must be between 16 and 1048576, got 8"),
        (["--device", "gpu"], "--device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got 'gpu'"),
        (["--dtype", "int8"], "--dtype must be one of float32, bfloat16, float16, auto, got 'int8'"),
        (["--top-p", "0"], "--top-p must be in (0, 1], got 0.0"),
        (["--max-tokens", "0"], "--max-tokens must be >= 1, got 0"),
    ],
)
def test_engine_errors_name_the_flags(capsys, flags, message):
    assert compare_error(capsys, *flags) == message


def test_only_the_commands_flags_are_named():
    add = build_parser().parse_args(["adapters", "add", "folder"])
    slots = InvalidSetting("{max_loras} must be >= 1", {"max_loras": 0})
    assert in_flag_words(slots, add, set()) == "max_loras must be >= 1"  # add has no --max-loras
    prose = ValueError("model folder x is missing")
    assert in_flag_words(prose, add, set()) == "model folder x is missing"  # a message that names no setting
    model = InvalidSetting("{model} must be a folder", {"model": "x"})
    assert in_flag_words(model, add, {"--model"}) == "--model must be a folder"
    assert in_flag_words(ValueError("the max_lora_rank_x field"), add, set()) == "the max_lora_rank_x field"
    rank = InvalidSetting("exceeds {max_lora_rank:=}", {"max_lora_rank": 16})
    typed = in_flag_words(rank, add, {"--max-lora"})  # argparse takes a unique prefix
    assert typed == "exceeds --max-lora-rank=16"


def test_the_flag_vocabulary_holds_every_declared_flag():
    """The vocabulary is made from the declarations: a setting's flag is there once it is declared."""
    every = {
        item.name: item.setting.flag
        for cls in (EngineConfig, PoolSettings, ServerConfig)
        for item in declared(cls)
        if item.setting.flag is not None
    }
    assert flags() == every
    assert flags()["batch_invariant"] == "--batch-invariant" and flags()["quantization"] == "--quantization"
    assert flags()["token_table_memory_gb"] == "--token-table-gb"


@pytest.fixture
def library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path, tiny_adapters) -> Registry:
    monkeypatch.setenv("MULTILORA_STUDIO_HOME", str(tmp_path / "home"))
    registry = Registry()
    registry.import_folder(tiny_adapters["tiny-r8-all"], describe_base(str(tiny_model_dir)), name="first")
    return registry


def test_a_rank_above_the_default_cap_names_the_flag(capsys, library, tiny_model_dir, tiny_adapters):
    folder = str(tiny_adapters["tiny-r32-ko-down"])
    message = error_of(capsys, "adapters", "add", folder, "--model", str(tiny_model_dir))
    assert message.endswith(
        "rank 32 exceeds --max-lora-rank=16 (the default); raise --max-lora-rank to use this adapter"
    )


def test_name_hints_point_at_flags_the_command_has(capsys, library, tiny_model_dir, tiny_adapters):
    folder = str(tiny_adapters["tiny-r4-qv"])
    message = error_of(capsys, "adapters", "add", folder, "--model", str(tiny_model_dir), "--name", "first")
    assert message == "the library already has an adapter or alias named 'first'; choose another with --name"
    library.import_folder(folder, describe_base(str(tiny_model_dir)), name="second")
    message = error_of(capsys, "adapters", "rename", "second", "first")
    assert message == "the library already has an adapter or alias named 'first'; choose another name"
    assert "--name" not in error_of(capsys, "adapters", "rename", "second", "base")


def known_flags(parser: argparse.ArgumentParser) -> set[str]:
    return {
        flag
        for command, _ in commands(parser)
        for action in command._actions
        for flag in action.option_strings
    }


def test_every_flag_a_message_or_docstring_names_exists():
    """Strings that name flags (hints, help, docstrings) name real ones; pip's and llama.cpp's are theirs."""
    known = known_flags(build_parser())
    unknown = []
    for path in sorted(set(PACKAGE.rglob("*.py")) - OWN_PARSERS):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if any(tool in node.value for tool in OTHER_TOOLS):
                    continue
                unknown += [
                    f"{path.relative_to(PACKAGE)}: {f}" for f in FLAG.findall(node.value) if f not in known
                ]
    assert unknown == []
