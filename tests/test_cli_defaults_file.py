"""The command line's defaults file (``config.toml`` in the data directory): one value for every command."""

from __future__ import annotations

import pytest

from multilora_studio.cli import build_parser, main
from multilora_studio.cli.defaults_file import DefaultsFileError, apply_defaults, long_flags
from multilora_studio.paths import command_defaults_path


@pytest.fixture
def defaults(tmp_path, monkeypatch):
    """Write the defaults file of a fresh data directory."""
    monkeypatch.setenv("MULTILORA_STUDIO_HOME", str(tmp_path))

    def write(text: str):
        command_defaults_path().write_text(text)
        return command_defaults_path()

    return write


def parsed(*argv: str):
    parser = build_parser()
    apply_defaults(parser, command_defaults_path(), lambda: long_flags(build_parser()))
    return parser.parse_args(list(argv))


def test_a_value_in_the_file_is_every_commands_default_and_a_typed_flag_wins(defaults):
    defaults("max-lora-rank = 64\nmax-loras = 4\n")
    assert parsed("pull", "org/name").max_lora_rank == 64
    assert parsed("adapters", "add", "folder").max_lora_rank == 64
    compare = parsed("compare", "--prompt", "hi")
    assert (compare.max_lora_rank, compare.max_loras) == (64, 4)
    assert parsed("compare", "--prompt", "hi", "--max-lora-rank", "8").max_lora_rank == 8


def test_without_a_file_the_defaults_are_the_flags_own(tmp_path, monkeypatch):
    monkeypatch.setenv("MULTILORA_STUDIO_HOME", str(tmp_path))
    assert not command_defaults_path().exists()
    assert parsed("pull", "org/name").max_lora_rank == 16


def test_switches_take_true_or_false_in_either_spelling(defaults):
    defaults("no-batch-invariant = true\n")
    assert parsed("compare", "--prompt", "hi").batch_invariant is False
    defaults("batch-invariant = false\nno-record = true\n")
    assert parsed("eval", "--prompts", "x.jsonl").batch_invariant is False
    assert parsed("eval", "--prompts", "x.jsonl").no_record is True
    assert parsed("eval", "--prompts", "x.jsonl", "--batch-invariant").batch_invariant is True


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("max-lora-rnak = 64\n", "no command has a flag --max-lora-rnak"),
        ("max-lora-rank = 'big'\n", "max-lora-rank = 'big' is not a value --max-lora-rank takes"),
        ("dtype = 'float8'\n", "dtype = 'float8' is not one of"),
        ("no-record = 1\n", "no-record takes true or false, not 1"),
        ("max-lora-rank = [64]\n", "max-lora-rank takes one value"),
        ("[engine]\nmax-lora-rank = 64\n", "not tables: engine"),
        ("max-lora-rank = \n", "is not valid TOML"),
    ],
)
def test_a_bad_file_is_refused_naming_the_file_and_the_key(defaults, text, message):
    path = defaults(text)
    with pytest.raises(DefaultsFileError) as refused:
        parsed("compare", "--prompt", "hi")
    assert message in str(refused.value) and str(path) in str(refused.value)


def test_a_bad_file_ends_a_command_with_one_line(defaults, capsys):
    path = defaults("max-lora-rnak = 64\n")
    assert main(["adapters", "list"]) == 2
    assert capsys.readouterr().err == f"error: {path}: no command has a flag --max-lora-rnak\n"


def test_a_raised_rank_lets_a_command_take_a_rank_32_adapter(defaults, tiny_model_dir, tiny_adapters, capsys):
    adapter = str(tiny_adapters["tiny-r32-ko-down"])
    command = ["adapters", "add", adapter, "--name", "wide", "--model", str(tiny_model_dir)]
    assert main(command) == 1
    assert "--max-lora-rank" in capsys.readouterr().err
    defaults("max-lora-rank = 32\n")
    assert main(command) == 0
    assert main(["adapters", "show", "wide"]) == 0
    assert "32" in capsys.readouterr().out
