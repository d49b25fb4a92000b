"""Files moved inside a library write transaction: each rename is undone, newest first, when
the transaction does not commit, so a row and its files change together or not at all."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class Moves:
    """The renames of one transaction, in order."""

    def __init__(self) -> None:
        self._done: list[tuple[Path, Path]] = []

    def rename(self, source: Path, target: Path) -> None:
        os.replace(source, target)
        self._done.append((source, target))

    def undo(self) -> None:
        while self._done:
            source, target = self._done.pop()
            os.replace(target, source)


@contextmanager
def moving(
    transaction: contextlib.AbstractContextManager[sqlite3.Connection],
) -> Iterator[tuple[sqlite3.Connection, Moves]]:
    """``transaction``'s connection and the renames made in it, undone if it does not commit."""
    moves = Moves()
    try:
        with transaction as conn:
            yield conn, moves
    except BaseException:
        moves.undo()
        raise
