"""The command line's defaults file: flag values set once for every command.

``config.toml`` in the user data directory holds ``flag-name = value`` lines, each a flag's long
name without its dashes (``max-lora-rank = 64``). Every command that has the flag takes the
value as its default; a flag typed on the command line still wins. A key that no command has,
or a value its flag refuses, is an error that names the file and the key.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from multilora_studio.cli.shared import Subcommands

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


class DefaultsFileError(ValueError):
    """The defaults file cannot be read, names an unknown flag, or gives a value its flag refuses."""


def read_defaults(path: Path) -> dict[str, Any]:
    """The file's ``flag-name = value`` pairs; none when there is no file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as error:
        raise DefaultsFileError(f"cannot read the defaults file {path}: {error}") from error
    try:
        values = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise DefaultsFileError(f"the defaults file {path} is not valid TOML: {error}") from error
    tables = [key for key, value in values.items() if isinstance(value, dict)]
    if tables:
        raise DefaultsFileError(
            f"the defaults file {path} takes flag-name = value lines, not tables: {tables[0]}"
        )
    return values


def parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """``parser`` and every command's parser below it."""
    yield parser
    for action in parser._actions:  # argparse has no public accessor for a parser's commands
        if isinstance(action, Subcommands):
            for child in action.choices.values():
                yield from parsers(child)


def flag_value(action: argparse.Action, key: str, value: Any, path: Path) -> Any:
    """``value`` as the flag would parse it, or an error naming the file and the key."""
    flag = f"--{key}"
    if action.dest == argparse.SUPPRESS or (
        action.nargs == 0 and action.const is None and not isinstance(action, argparse.BooleanOptionalAction)
    ):
        raise DefaultsFileError(f"{path}: {flag} cannot be given a default")
    if action.nargs == 0:
        if not isinstance(value, bool):
            raise DefaultsFileError(f"{path}: {key} takes true or false, not {value!r}")
        if isinstance(action, argparse.BooleanOptionalAction):
            return value if flag == action.option_strings[0] else not value  # [--x, --no-x]
        return action.const if value else action.default
    if isinstance(value, (list, dict)):
        raise DefaultsFileError(f"{path}: {key} takes one value, as {flag} does")
    try:
        parsed = action.type(str(value)) if callable(action.type) else str(value)
    except (ValueError, TypeError, argparse.ArgumentTypeError) as error:
        raise DefaultsFileError(f"{path}: {key} = {value!r} is not a value {flag} takes ({error})") from error
    if action.choices is not None and parsed not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise DefaultsFileError(f"{path}: {key} = {value!r} is not one of {choices}")
    return parsed


def apply_defaults(parser: argparse.ArgumentParser, path: Path, every_flag: Callable[[], set[str]]) -> None:
    """Set the file's values as the defaults of the flags ``parser``'s commands have.

    ``every_flag`` gives the long flags of every command (asked only when a key is not one of
    ``parser``'s, so that a command line imports only its command's module otherwise).
    """
    values = read_defaults(path)
    used: set[str] = set()
    for each in parsers(parser):
        for action in each._actions:
            for key, value in values.items():
                if f"--{key}" in action.option_strings:
                    each.set_defaults(**{action.dest: flag_value(action, key, value, path)})
                    used.add(key)
    unknown = [key for key in values if key not in used and f"--{key}" not in every_flag()]
    if unknown:
        raise DefaultsFileError(f"{path}: no command has a flag --{unknown[0]}")


def long_flags(parser: argparse.ArgumentParser) -> set[str]:
    """Every long flag of ``parser`` and its commands."""
    return {
        option
        for each in parsers(parser)
        for action in each._actions
        for option in action.option_strings
        if option.startswith("--")
    }
