"""The examples of the user docs, read from their Markdown and run as a reader pastes them.

A fenced block tagged ``python`` runs as one script; a block tagged ``bash`` runs each of its
``multilora-studio`` commands (a command continued with ``\\`` is one command). A block a
reader cannot run here (it opens the window, installs packages, needs a GPU, the Hub or a
folder of the reader's own) carries ``<!-- not run: REASON -->`` on the line above its fence.
Other tags (``text``, ``jsonl``, ``csv``, ``powershell``, output) are not examples to run.

The only change made to what is pasted: a server's port. Docs address ``127.0.0.1:8000``;
the runner gives each ``serve`` a free port and rewrites that address in the scripts.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
DOCS_ADDRESS = "127.0.0.1:8000"
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(?P<reason>\S.*?)\s*-->$")
FENCE = re.compile(r"^(?P<fence>```+)(?P<tag>[\w-]*)\s*$")
RUN_TAGS = ("python", "bash")
COMMAND = "multilora-studio"
CURL = "curl"  # a request to the server the doc started (its answer must not be an error)
# commands that open the window (the default command is `gui`)
WINDOW_COMMANDS = ((COMMAND,), (COMMAND, "gui"))
SERVE_START_S = 180.0
COMMAND_TIMEOUT_S = 240.0


@dataclass(frozen=True)
class Example:
    """One fenced block of a Markdown file."""

    path: Path
    line: int  # 1-based line of the opening fence
    tag: str
    text: str
    not_run: str | None  # the reason given above the fence, if any

    @property
    def where(self) -> str:
        shown = self.path.relative_to(REPOSITORY) if self.path.is_relative_to(REPOSITORY) else self.path
        return f"{shown}:{self.line}"


def user_docs() -> list[Path]:
    """The README and the user guides (``docs/*.md``; development notes in docs/dev/ are apart)."""
    return [REPOSITORY / "README.md", *sorted((REPOSITORY / "docs").glob("*.md"))]


def read_examples(path: Path) -> list[Example]:
    """Every fenced block of ``path``, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    examples: list[Example] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index].strip())
        if not opening:
            index += 1
            continue
        above = lines[index - 1].strip() if index else ""
        marker = NOT_RUN.match(above)
        end = index + 1
        while end < len(lines) and lines[end].strip() != opening["fence"]:
            end += 1
        text = "\n".join(lines[index + 1 : end])
        examples.append(Example(path, index + 1, opening["tag"], text, marker["reason"] if marker else None))
        index = end + 1
    return examples


# the guides whose examples run in ``test_api_guide_examples.py``; the others in ``test_guide_examples.py``
API_GUIDES = ("python-api.md", "server.md", "lm-eval.md")


def guides_with_examples() -> list[Path]:
    """The user guides (not the README) with an example to run."""
    return [path for path in user_docs() if path.name != "README.md" and runnable(read_examples(path))]


def runnable(examples: list[Example]) -> list[Example]:
    return [example for example in examples if example.tag in RUN_TAGS and example.not_run is None]


def commands(example: Example) -> Iterator[list[str]]:
    """The commands of a ``bash`` block, each as its words (comments and continuations resolved)."""
    joined = re.sub(r"\\\n", " ", example.text)
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            yield words


def problems(example: Example) -> list[str]:
    """Why a block that is run could not be run as pasted (empty when it can)."""
    if example.tag != "bash" or example.not_run is not None:
        return []
    found = []
    for words in commands(example):
        if words[0] not in (COMMAND, CURL):
            found.append(f"{example.where}: `{shlex.join(words)}` is not a {COMMAND} or {CURL} command")
        elif tuple(words[:2]) in WINDOW_COMMANDS or words == [COMMAND]:
            found.append(f"{example.where}: `{shlex.join(words)}` opens the window")
    return found


def executable() -> str:
    """The ``multilora-studio`` script of the Python running the tests."""
    script = Path(sys.executable).parent / COMMAND
    return str(script) if script.exists() else COMMAND


# Runs the scripts it is sent (a path a line) one after another, each in a namespace of its own
# (a missing import still fails), and ends each one's output with a line saying how it ended.
SCRIPT_HOST = r"""
import runpy, sys, traceback
for line in sys.stdin:
    try:
        runpy.run_path(line.strip(), run_name="__main__")
        status = 0
    except SystemExit as stop:
        status = 0 if stop.code in (None, 0) else 1
    except BaseException:
        traceback.print_exc(file=sys.stdout)
        status = 1
    print(f"\0ended {status}", flush=True)
"""
ENDED = "\0ended "


class Reader:
    """Runs one file's examples in order, as a new user: its own user data directory, and a
    working directory that holds the checkout's ``resources`` and ``docs`` (files the examples
    name) and whatever the examples write.

    Python blocks run in one interpreter, one after another (importing torch once, not once a
    block), each in a namespace of its own."""

    def __init__(self, home: Path, cwd: Path) -> None:
        self.env = os.environ | {"MULTILORA_STUDIO_HOME": str(home), "PYTHONUNBUFFERED": "1"}
        self.env.pop("MULTILORA_STUDIO_NO_DEMO_ADAPTERS", None)
        self.home = home
        self.cwd = cwd
        for shared in ("resources", "docs"):
            (cwd / shared).symlink_to(REPOSITORY / shared, target_is_directory=True)
        self.scripts: subprocess.Popen[str] | None = None
        self.server: subprocess.Popen[str] | None = None
        self.address = ""
        self.seconds: dict[str, float] = {}  # each example's time, for a test to report

    def run(self, example: Example) -> None:
        started = time.monotonic()
        self.run_example(example)
        self.seconds[example.where] = time.monotonic() - started

    def run_example(self, example: Example) -> None:
        if example.tag == "python":
            self.run_script(example)
        else:
            for words in commands(example):
                if words[1:2] == ["serve"]:
                    self.start_server(words, example)
                elif words[0] == CURL:
                    self.run_request(words, example)
                else:
                    self.run_command(words, example)

    def run_script(self, example: Example) -> None:
        script = example.text
        if DOCS_ADDRESS in script:
            if self.server is None:
                self.start_server([COMMAND, "serve"], example)
            script = script.replace(DOCS_ADDRESS, self.address)
        path = self.home / f"example-{len(self.seconds)}.py"
        path.write_text(script)
        if self.scripts is None:
            self.scripts = subprocess.Popen(
                [sys.executable, "-c", SCRIPT_HOST], cwd=self.cwd, env=self.env, text=True,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            )  # fmt: skip
        assert self.scripts.stdin and self.scripts.stdout
        watchdog = threading.Timer(COMMAND_TIMEOUT_S, self.scripts.kill)
        watchdog.start()
        try:
            self.scripts.stdin.write(f"{path}\n")
            self.scripts.stdin.flush()
            output = []
            for line in self.scripts.stdout:
                if line.startswith(ENDED):
                    break
                output.append(line)
            else:
                line = f"{ENDED}the interpreter died or ran past {COMMAND_TIMEOUT_S:.0f} s"
        finally:
            watchdog.cancel()
        text = "".join(output)
        assert line.strip() == f"{ENDED}0", (
            f"{example.where}: the script failed ({line.strip().lstrip(chr(0))})\n{text[-4000:]}"
        )

    def run_command(self, words: list[str], example: Example) -> None:
        done = subprocess.run([executable(), *words[1:]], **self.options())
        self.check(done, example, shlex.join(words))

    def run_request(self, words: list[str], example: Example) -> None:
        if self.server is None:
            self.start_server([COMMAND, "serve"], example)
        pasted = [word.replace(DOCS_ADDRESS, self.address) for word in words]
        done = subprocess.run(pasted, **self.options())
        self.check(done, example, shlex.join(words))
        assert not done.stdout.lstrip().startswith('{"error"'), (
            f"{example.where}: {shlex.join(words)}: {done.stdout}"
        )

    def options(self) -> dict:
        return {
            "cwd": self.cwd,
            "env": self.env,
            "capture_output": True,
            "text": True,
            "timeout": COMMAND_TIMEOUT_S,
        }

    @staticmethod
    def check(done: subprocess.CompletedProcess[str], example: Example, what: str) -> None:
        assert done.returncode == 0, (
            f"{example.where}: {what} ended with {done.returncode}\n"
            f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
        )

    def start_server(self, words: list[str], example: Example) -> None:
        """``serve`` as pasted on a free port; it serves the scripts that follow until the next."""
        self.stop_server()
        logs = self.home
        out, err = logs / "serve.out", logs / "serve.err"
        with out.open("w") as stdout, err.open("w") as stderr:
            self.server = subprocess.Popen(
                [executable(), *words[1:], "--port", "0"],
                cwd=self.cwd,
                env=self.env,
                stdout=stdout,
                stderr=stderr,
            )
        deadline = time.monotonic() + SERVE_START_S
        while time.monotonic() < deadline and self.server.poll() is None:
            first = out.read_text().partition("\n")
            if first[1]:
                break
            time.sleep(0.2)
        line = out.read_text().partition("\n")[0]
        if not line.startswith("serving "):
            self.server.kill()
            self.server.wait()
            self.server = None
            raise AssertionError(
                f"{example.where}: `{shlex.join(words)}` did not start: {line}\n{err.read_text()[-3000:]}"
            )
        self.address = line.rsplit(" at http://", 1)[1].strip().removesuffix("/v1")

    def stop_server(self) -> None:
        if self.server is None:
            return
        self.server.send_signal(signal.SIGINT)
        try:
            code = self.server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.server.kill()
            raise AssertionError("the server did not stop within 30 s of Ctrl+C") from None
        finally:
            self.server = None
        assert code == 0, f"the server ended with {code} after Ctrl+C"

    def close(self) -> None:
        self.stop_server()
        if self.scripts is not None:
            self.scripts.kill()
            self.scripts.wait()
