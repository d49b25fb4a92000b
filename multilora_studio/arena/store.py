"""The arena's votes on disk: ``arena.sqlite3`` in the library's folder (the user data directory
by default), so a leaderboard survives restarts and is recomputed from its votes.

As in the adapter library, every operation opens its own connection (WAL journal, busy timeout)
and every write is one ``BEGIN IMMEDIATE`` transaction: the window, the command line and other
processes can share the file.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from multilora_studio.arena.store_schema import COLUMNS, migrate
from multilora_studio.arena.votes import Vote
from multilora_studio.paths import data_dir

DB_FILE = "arena.sqlite3"
BUSY_TIMEOUT_S = 10.0


class VoteStore:
    """The votes in ``root / DB_FILE``; safe to share between threads."""

    def __init__(self, root: Path | None = None, busy_timeout_s: float = BUSY_TIMEOUT_S) -> None:
        self.root = Path(root) if root is not None else data_dir()
        self.path = self.root / DB_FILE
        self.busy_timeout_s = busy_timeout_s
        self.root.mkdir(parents=True, exist_ok=True)
        with self._connect() as conn:
            conn.execute("PRAGMA journal_mode = WAL")
        with self._write() as conn:
            migrate(conn)

    def add(self, votes: Sequence[Vote]) -> None:
        """Record ``votes`` together (all or none)."""
        rows = [
            (
                v.round_id,
                v.prompt,
                v.left,
                v.right,
                v.output_left,
                v.output_right,
                v.verdict,
                json.dumps(v.settings, sort_keys=True),
                v.base_digest,
                v.digest_left,
                v.digest_right,
                v.voter,
                v.created,
            )
            for v in votes
        ]
        with self._write() as conn:
            conn.executemany(f"INSERT INTO votes ({COLUMNS}) VALUES ({', '.join('?' * 13)})", rows)

    def votes(self, base_digest: str | None = None, voter: str | None = None) -> list[Vote]:
        """The votes, oldest first: all, or those on one base's weights and of one voter."""
        query, arguments = f"SELECT {COLUMNS} FROM votes WHERE 1", []
        if base_digest is not None:
            query += " AND base_digest = ?"
            arguments.append(base_digest)
        if voter is not None:
            query += " AND voter = ?"
            arguments.append(voter)
        with self._connect() as conn:
            rows = conn.execute(query + " ORDER BY created, id", arguments).fetchall()
        return [_vote(row) for row in rows]

    def voters(self) -> list[str]:
        with self._connect() as conn:
            return [row[0] for row in conn.execute("SELECT DISTINCT voter FROM votes ORDER BY voter")]

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.path, self.busy_timeout_s, isolation_level=None)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
            yield conn
        finally:
            conn.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise


def _vote(row: tuple) -> Vote:
    names = [name.strip() for name in COLUMNS.split(",")]
    data = dict(zip(names, row, strict=True))
    return Vote(
        round_id=data["round_id"],
        prompt=data["prompt"],
        left=data["left_name"],
        right=data["right_name"],
        output_left=data["output_left"],
        output_right=data["output_right"],
        verdict=data["verdict"],
        settings=json.loads(data["settings"]),
        base_digest=data["base_digest"],
        digest_left=data["digest_left"],
        digest_right=data["digest_right"],
        voter=data["voter"],
        created=data["created"],
    )
