"""Parameter grids of the kernel tests: every combination where the kernels run natively, a
covering subset of the Triton cases under Triton's interpreter (which runs each program of a
launch in Python, so each case costs seconds on the CPU; a GPU host runs the whole grid)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from typing import Any

import pytest

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def covering(*axes: Sequence[Any], full: int = 2, shift: int = 0) -> list[tuple[Any, ...]]:
    """Every combination of the first ``full`` axes, each further axis's values in turn (a Latin
    square: its value index is the sum of the others' indices plus ``shift``): every value of
    every axis appears, next to every value of the first ``full`` axes."""
    rows = []
    for picked in itertools.product(*(list(enumerate(axis)) for axis in axes[:full])):
        turn = sum(i for i, _ in picked) + shift
        rest = tuple(axis[turn % len(axis)] for axis in axes[full:])
        rows.append((*(value for _, value in picked), *rest))
    return rows


def grid(
    paths: Sequence[Any],
    *axes: Sequence[Any],
    interpreted: Callable[..., bool],
    full: int = 2,
    turn: int = 0,
) -> list[Any]:
    """pytest params: each of ``paths`` (a value, a tuple of values or a ``pytest.param``: the
    test's first arguments, its marks and id) with every combination of ``axes``, except that
    under the interpreter a path for which ``interpreted(*values)`` is true (its kernels run in
    the interpreter) gets only ``covering(*axes, full=full)``, turned by the path's index (plus
    ``turn``, which lets two tests take different turns) so that the paths together meet more
    combinations."""
    params = []
    for index, path in enumerate(paths):
        values, marks, path_id = _unpack(path)
        subset = INTERPRETED and interpreted(*values)
        combos = covering(*axes, full=full, shift=index + turn) if subset else itertools.product(*axes)
        for combo in combos:
            ids = [path_id, *(_id(value) for value in combo)]
            params.append(pytest.param(*values, *combo, marks=marks, id="-".join(ids)))
    return params


def _unpack(path: Any) -> tuple[tuple[Any, ...], Any, str]:
    if hasattr(path, "values") and hasattr(path, "marks"):  # a pytest.param
        values = tuple(path.values)
        return values, path.marks, path.id or "-".join(_id(value) for value in values)
    values = path if isinstance(path, tuple) else (path,)
    return values, (), "-".join(_id(value) for value in values)


def _id(value: Any) -> str:
    return "x".join(map(str, value)) if isinstance(value, tuple) else str(value)
