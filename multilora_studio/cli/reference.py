"""docs/cli.md from the parsers: every command, its arguments, their defaults and help.

``python -m multilora_studio.cli.reference [PATH]`` (``make docs``) rewrites the file
(default ``docs/cli.md``); ``render()`` is what a test compares it with. The tables are
built from the parsers' actions, not from ``format_help``, so the page reads the same on
every Python version and terminal width.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

from multilora_studio.cli import build_parser
from multilora_studio.cli.shared import Subcommands

DEFAULT_PATH = Path("docs/cli.md")
DEFAULT_GROUPS = ("positional arguments", "options", "optional arguments")  # argparse's own titles
METAVARS: dict[object, str] = {int: "N", float: "X", Path: "PATH"}  # a flag's value, by its type
INTRO = """\
# Command line reference

Generated from the parsers by `make docs` (`python -m multilora_studio.cli.reference`);
`tests/test_cli_reference.py` fails when this page differs from them. Every command also
takes `-h` / `--help`. Without a command, `multilora-studio` opens the window (`gui`).
An engine setting's default is `EngineConfig`'s ([python-api.md](python-api.md)), the same in the window's
Settings. Errors name the flags as typed here; a value the command line did not set is
marked `(the default)`. The make targets and the installers' variables are in
[installers.md](installers.md).

A value set once for every command goes in `config.toml` in the data directory
(`~/.local/share/multilora-studio/` on Linux, `$MULTILORA_STUDIO_HOME` when set), one
`flag-name = value` line each, the flag's long name without its dashes
(`max-lora-rank = 64`, `no-batch-invariant = true`). Every command that has the flag takes
the value as its default; a flag typed on the command line still wins; a key no command has
is an error naming the file.
"""


def commands(parser: argparse.ArgumentParser) -> Iterator[tuple[argparse.ArgumentParser, str]]:
    """The parser, then each command's parser (depth first), with the help it is listed with."""
    yield parser, ""
    for action in parser._actions:  # argparse has no public accessor for a parser's commands
        if isinstance(action, Subcommands):
            listed = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, child in action.choices.items():
                for sub, text in commands(child):
                    yield sub, text or listed.get(name, "")


def argument(action: argparse.Action) -> str:
    """How the argument is written: ``--max-loras N``, ``--raw``, ``NAME``, ``{prepare,info}``."""
    if action.choices is not None:
        value = "{" + ",".join(map(str, action.choices)) + "}"
    elif isinstance(action.metavar, str):
        value = action.metavar
    elif action.option_strings:
        value = METAVARS.get(action.type, action.dest.upper())
    else:
        value = action.dest.upper()
    if action.nargs in ("*", "+"):
        value += " ..."
    if not action.option_strings:
        return f"`{value}`" + (" (optional)" if action.nargs in ("?", "*") else "")
    if action.nargs == 0:
        return ", ".join(f"`{flag}`" for flag in action.option_strings)
    return ", ".join(f"`{flag} {value}`" for flag in action.option_strings)


def default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    if action.nargs == 0 or action.default is None or action.default in ([], argparse.SUPPRESS):
        return ""
    return f"`{action.default}`" if action.default != "" else '`""`'


def described(action: argparse.Action, prog: str) -> str:
    text = (action.help or "") % {**vars(action), "prog": prog}
    return text.replace("|", "\\|")


def table(actions: list[argparse.Action], prog: str) -> list[str]:
    rows = ["| argument | default | what it does |", "| --- | --- | --- |"]
    for action in actions:
        rows.append(f"| {argument(action)} | {default(action)} | {described(action, prog)} |")
    return [*rows, ""]


def section(parser: argparse.ArgumentParser, listed: str) -> list[str]:
    lines = [f"## `{parser.prog}`", "", parser.description or listed, ""]
    arguments: list[argparse.Action] = []
    groups: list[tuple[str, list[argparse.Action]]] = []
    for group in parser._action_groups:  # argparse keeps the groups without a public accessor
        for action in group._group_actions:
            if isinstance(action, Subcommands):
                lines += ["| command | what it does |", "| --- | --- |"]
                lines += [f"| `{parser.prog} {c.dest}` | {c.help} |" for c in action._choices_actions]
                lines.append("")
        shown = [a for a in group._group_actions if a.dest != "help" and not isinstance(a, Subcommands)]
        if group.title in DEFAULT_GROUPS:
            arguments += shown
        elif shown:
            groups.append((group.title or "", shown))
    if arguments:
        lines += table(arguments, parser.prog)
    for title, actions in groups:
        lines += [f"{title}:", "", *table(actions, parser.prog)]
    return lines


def render() -> str:
    lines = [INTRO]
    for parser, listed in commands(build_parser()):
        lines += section(parser, listed)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    path = Path(args[0]) if args else DEFAULT_PATH
    path.write_text(render())
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
