"""A closed stdout (``multilora-studio ... | head -1``) ends a command quietly, without a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from multilora_studio.adapters.registry import Registry
from multilora_studio.cli import PIPE_CLOSED
from multilora_studio.cli.shared import describe_base


def run_into_closed_pipe(*argv: str) -> tuple[int, str]:
    """Run the command with its stdout a pipe whose only reader closed before the command wrote."""
    process = subprocess.Popen(
        [sys.executable, "-m", "multilora_studio", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the command's first write (or its last flush) gets EPIPE
    err = process.stderr.read().decode()
    return process.wait(timeout=300), err


@pytest.fixture
def library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path, tiny_adapters) -> None:
    monkeypatch.setenv("MULTILORA_STUDIO_HOME", str(tmp_path / "home"))  # the child inherits it
    monkeypatch.setenv("MULTILORA_STUDIO_NO_DEMO_ADAPTERS", "1")
    base = describe_base(str(tiny_model_dir))
    for name in ("tiny-r8-all", "tiny-r4-qv"):
        Registry().import_folder(
            tiny_adapters[name], base, name=name, aliases=[f"{name}-{i}" for i in range(50)]
        )


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["adapters", "show", "tiny-r8-all", "--json"], PIPE_CLOSED),
        (["adapters", "list", "--json"], PIPE_CLOSED),
        (["bench", "--help"], 0),  # argparse drops a failed help write itself
    ],
    ids=lambda item: " ".join(item) if isinstance(item, list) else str(item),
)
def test_a_closed_pipe_ends_the_command_quietly(library, argv, code):
    assert run_into_closed_pipe(*argv) == (code, "")


def test_a_reader_that_stops_after_one_line_sees_that_line(library):
    process = subprocess.Popen(
        [sys.executable, "-m", "multilora_studio", "adapters", "list", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    assert process.stdout.readline() == b"[\n"  # what `| head -1` prints
    process.stdout.close()
    err = process.stderr.read().decode()
    assert process.wait(timeout=300) in (0, PIPE_CLOSED) and "Traceback" not in err and "Error" not in err
