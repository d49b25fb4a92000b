"""The arena's SQLite schema (``arena.sqlite3`` beside the adapter library's database) and its
migrations: migration n brings a database from user_version n-1 to n."""

from __future__ import annotations

import sqlite3

from multilora_studio.sqlite_schema import migrate as migrate_steps

SCHEMA_VERSION = 1
MIGRATIONS = {
    1: """
    CREATE TABLE votes (
        id INTEGER PRIMARY KEY,
        round_id TEXT NOT NULL,             -- one round's two answers (a judge's vote shares it)
        prompt TEXT NOT NULL,
        left_name TEXT NOT NULL,            -- the contender shown as A ('base' = no adapter)
        right_name TEXT NOT NULL,           -- the contender shown as B
        output_left TEXT NOT NULL,
        output_right TEXT NOT NULL,
        verdict TEXT NOT NULL CHECK (verdict IN ('a', 'b', 'tie', 'both_bad')),
        settings TEXT NOT NULL,             -- JSON: the sampling settings of both sides, seed included
        base_digest TEXT NOT NULL,          -- SHA-256 of the base weights ('' = unknown)
        digest_left TEXT NOT NULL,          -- SHA-256 of the adapter weights ('' = the base)
        digest_right TEXT NOT NULL,
        voter TEXT NOT NULL,                -- 'person' or 'judge:<model>'
        created REAL NOT NULL               -- unix time
    );
    CREATE INDEX votes_base ON votes (base_digest, voter, created);
    """,
}
COLUMNS = (
    "round_id, prompt, left_name, right_name, output_left, output_right, verdict, settings, "
    "base_digest, digest_left, digest_right, voter, created"
)


def migrate(conn: sqlite3.Connection) -> None:
    """Bring the open database up to ``SCHEMA_VERSION`` (in the caller's transaction)."""
    migrate_steps(
        conn,
        MIGRATIONS,
        "the arena's votes were written by a newer version (schema {version}); update MultiLoRA Studio",
    )
