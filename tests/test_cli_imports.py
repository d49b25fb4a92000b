"""The library's commands, ``--help`` and ``--version`` run without importing torch,
transformers, Qt or FastAPI (a command line imports only its own command's module)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from multilora_studio.adapters.registry import Registry
from multilora_studio.cli import COMMANDS, build_parser
from multilora_studio.cli.shared import describe_base

HEAVY = ("torch", "transformers", "PySide6", "fastapi", "uvicorn")
# Runs a command line in this interpreter and prints, on its last line, the heavy packages it
# imported; a SystemExit (--help, --version) counts as the command's end.
PROBE = f"""
import json, sys
from multilora_studio.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as end:
    code = end.code
print(json.dumps([code, [name for name in {HEAVY!r} if name in sys.modules]]))
"""


def imported_by(*argv: str) -> tuple[int, list[str]]:
    """(exit code, the heavy packages imported) of one command line in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=300, check=False
    )
    code, heavy = json.loads(done.stdout.splitlines()[-1])
    return code, heavy


@pytest.fixture
def library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path, tiny_adapters) -> None:
    monkeypatch.setenv("MULTILORA_STUDIO_HOME", str(tmp_path / "home"))  # the child inherits it
    monkeypatch.setenv("MULTILORA_STUDIO_NO_DEMO_ADAPTERS", "1")
    Registry().import_folder(tiny_adapters["tiny-r4-qv"], describe_base(str(tiny_model_dir)), name="qv")


@pytest.mark.parametrize(
    "argv",
    [
        ["adapters", "list"],
        ["adapters", "list", "--json"],
        ["adapters", "show", "qv"],
        ["adapters", "history", "qv"],
        ["adapters", "add", "--help"],
        ["--help"],
        ["--version"],
        ["-v", "adapters", "list"],
    ],
    ids=" ".join,
)
def test_the_library_commands_run_without_the_engine(library, argv):
    assert imported_by(*argv) == (0, [])


def test_an_engine_command_still_builds_its_parser():
    assert imported_by("serve", "--help")[0] == 0


def test_the_help_lines_of_the_command_list_are_those_of_the_commands():
    (subcommands,) = (action for action in build_parser()._actions if action.dest == "command")
    assert {choice.dest: choice.help for choice in subcommands._choices_actions} == COMMANDS
