"""Schema migrations of the project's SQLite files: numbered steps of SQL run in order, the
version reached kept in ``PRAGMA user_version``."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping


def migrate(conn: sqlite3.Connection, migrations: Mapping[int, str], newer: str) -> None:
    """Bring the open database up to the last of ``migrations`` (in the caller's write transaction);
    RuntimeError ``newer`` (``{version}`` filled in) for a file a newer version wrote."""
    latest = max(migrations)
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > latest:
        raise RuntimeError(newer.format(version=version))
    for step in range(version + 1, latest + 1):
        for statement in migrations[step].split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {step}")
