"""A user setting declared once: the field of a config dataclass carries its flag, the window's
label, help, bounds or choices and group (``setting``). The command line's flags, the window's
Settings form, the docs tables and the checks (``check_declared``) are made from the declaration.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from dataclasses import dataclass
from typing import Any, TypeVar

from multilora_studio.invalid_setting import InvalidSetting

T = TypeVar("T")
METADATA_KEY = "setting"


@dataclass(frozen=True)
class Setting:
    """How one setting shows and what it accepts.

    ``doc``: its meaning in the docs' table (Markdown). ``flag``, ``help``, ``metavar``: its
    command-line flag (None: none), the flag's help (argparse's ``%(default)s`` allowed) and the
    value's name in it; ``negatable``: its negation as well (``--no-batch-invariant``);
    ``flag_checks_choices``: the flag refuses a value not among ``choices`` (else the config's
    check names it). ``label``, ``tip``, ``group``: the window's words for it, its tooltip and the
    part of Settings that shows it (None: not shown). ``low``, ``high``: bounds of a number
    (``above``: ``low`` itself refused); ``choices``: the values a text setting takes. ``none``:
    what None means, in the window's words; ``unit`` and ``step``: the unit after a number (in the
    window and in a refusal) and the window's step.
    """

    doc: str = ""
    flag: str | None = None
    help: str = ""
    metavar: str | None = None
    negatable: bool = False
    flag_checks_choices: bool = True
    label: str | None = None
    tip: str = ""
    group: str | None = None
    low: float | None = None
    high: float | None = None
    above: bool = False
    choices: tuple[str, ...] = ()
    none: str = ""
    unit: str = ""
    step: float = 1


def setting(default: T, **declaration: Any) -> T:
    """A dataclass field with ``default`` and its ``Setting`` (keyword arguments as its fields)."""
    return dataclasses.field(default=default, metadata={METADATA_KEY: Setting(**declaration)})


@dataclass(frozen=True)
class Declared:
    """A declared field: its name and default, its value's type (``kind``: bool, int, float, str or
    tuple), whether it may be None, and its declaration."""

    name: str
    default: Any
    kind: type
    optional: bool
    setting: Setting

    @property
    def flag_word(self) -> str | None:
        """The flag without its dashes (``max-loras``), as a ``NAME=VALUE`` form writes it."""
        return self.setting.flag[2:] if self.setting.flag else None


@functools.cache
def declared(cls: type) -> tuple[Declared, ...]:
    """The declared fields of dataclass ``cls``, in its order."""
    hints = typing.get_type_hints(cls)
    found = []
    for item in dataclasses.fields(cls):
        if METADATA_KEY in item.metadata:
            kind, optional = _kind(hints[item.name])
            found.append(Declared(item.name, item.default, kind, optional, item.metadata[METADATA_KEY]))
    return tuple(found)


def declaration(cls: type, name: str) -> Declared:
    """Field ``name``'s declaration in ``cls``; KeyError when it has none."""
    for item in declared(cls):
        if item.name == name:
            return item
    raise KeyError(f"{cls.__name__}.{name} is not a declared setting")


def _kind(hint: Any) -> tuple[type, bool]:
    """(value type, whether None is allowed) of a field's type hint (``int | None`` -> int, True)."""
    optional = False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        rest = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        optional = len(rest) < len(typing.get_args(hint))
        hint = rest[0]
    origin = typing.get_origin(hint) or hint
    return (origin if origin in (bool, int, float, str, tuple) else object), optional


def check_declared(config: object) -> None:
    """Each declared field of ``config``, in order: its type, bounds and choices; InvalidSetting
    naming the first that is wrong. Text settings without choices and lists are their class's to
    check."""
    cls: type = type(config)
    for item in declared(cls):
        check_value(item, getattr(config, item.name))


def check_value(item: Declared, value: object) -> None:
    """``value`` for the declared field ``item``; InvalidSetting when it does not fit."""
    rules = item.setting
    if value is None and item.optional:
        return
    if item.kind is bool and not isinstance(value, bool):
        allowed = "True, False or None" if item.optional else "True or False"
        raise InvalidSetting.of(item.name, value, f"must be {allowed}, got {{value!r}}")
    if item.kind is int:
        check_int(item.name, value, rules.low, rules.high, unit=rules.unit)
    elif item.kind is float:
        check_number(item.name, value, rules.low, rules.high, not rules.above, unit=rules.unit)
    elif rules.choices and value not in rules.choices:
        listed = ", ".join(rules.choices) + (" or None" if item.optional else "")
        raise InvalidSetting.of(item.name, value, f"must be one of {listed}, got {{value!r}}")


def check_int(
    name: str, value: object, low: float | None, high: float | None = None, part: str = "", unit: str = ""
) -> None:
    """An integer within [low, high] (None: unbounded); ``part`` follows the name in a refusal
    (``stop_token_ids entry``), ``unit`` the bound."""
    says = f"{part} must" if part else "must"
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidSetting.of(name, value, f"{says} be an integer, got {{value!r}}")
    if (low is not None and value < low) or (high is not None and value > high):
        limit = f"between {int(low)} and {int(high)}" if low is not None and high is not None else f">= {low}"
        raise InvalidSetting.of(name, value, f"{says} be {limit}{unit}, got {{value}}")


def check_number(
    name: str,
    value: object,
    low: float | None,
    high: float | None,
    low_inclusive: bool,
    part: str = "",
    unit: str = "",
) -> None:
    """A number (not NaN) within ``low`` (kept or not) and ``high`` (None: unbounded)."""
    says = f"{part} must" if part else "must"
    if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
        raise InvalidSetting.of(name, value, f"{says} be a number, got {{value!r}}")
    below = low is not None and (value < low or (value == low and not low_inclusive))
    if below or (high is not None and value > high):
        if high is None:
            limit = f"{'>=' if low_inclusive else '>'} {low:g}{unit}"
        else:
            limit = f"in {'[' if low_inclusive else '('}{low:g}, {high:g}]{unit}"
        raise InvalidSetting.of(name, value, f"{says} be {limit}, got {{value!r}}")
