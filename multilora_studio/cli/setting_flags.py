"""Command-line flags made from setting declarations (``engine/settings.py``): each flag's value
type, default, choices, help and value name come from its field, and the values parsed go back to
the fields by name (``setting_values``).

The declarations are read when a parser is built (they import the engine, torch): the library's
commands run without them.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from multilora_studio.engine.settings import Declared


def add_setting_flag(parser: argparse._ActionsContainer, cls: type, name: str, **overrides: Any) -> None:
    """The flag of ``cls``'s field ``name``; ``overrides`` replace what the command says its own
    way (``help``, ``default``)."""
    from multilora_studio.engine.settings import declaration

    add_flag(parser, declaration(cls, name), **overrides)


def add_setting_flags(parser: argparse._ActionsContainer, cls: type, skip: tuple[str, ...] = ()) -> None:
    """The flags of ``cls``'s fields that have one, in its order, but those named in ``skip``."""
    from multilora_studio.engine.settings import declared

    for item in declared(cls):
        if item.setting.flag is not None and item.name not in skip:
            add_flag(parser, item)


def add_flag(parser: argparse._ActionsContainer, item: Declared, **overrides: Any) -> None:
    rules = item.setting
    if rules.flag is None:
        raise ValueError(f"{item.name} has no flag")
    options: dict[str, Any] = {"default": item.default, "help": rules.help}
    if rules.metavar is not None:
        options["metavar"] = rules.metavar
    if item.kind is bool:
        options["action"] = argparse.BooleanOptionalAction if rules.negatable else "store_true"
    elif item.kind is tuple:
        options.update(nargs="*", default=list(item.default))
    elif item.kind in (int, float):
        options["type"] = item.kind
    if rules.choices and rules.flag_checks_choices:
        options["choices"] = rules.choices
    parser.add_argument(rules.flag, **{**options, **overrides})


def dest_of(flag: str) -> str:
    """The attribute argparse stores ``flag``'s value in."""
    return flag.lstrip("-").replace("-", "_")


def setting_values(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """Each field of ``cls`` whose flag the command has, with the value parsed (lists as tuples)."""
    from multilora_studio.engine.settings import declared

    values = {}
    for item in declared(cls):
        if item.setting.flag is not None and hasattr(args, dest_of(item.setting.flag)):
            value = getattr(args, dest_of(item.setting.flag))
            values[item.name] = tuple(value) if item.kind is tuple else value
    return values
