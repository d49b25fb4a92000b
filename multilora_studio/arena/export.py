"""Arena votes and leaderboards to and from files: ``.json`` (the votes and the table) or
``.csv`` (one vote a row); a file written here reads back to the same votes, so a leaderboard
can be recomputed from it."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from multilora_studio.arena.leaderboard import Leaderboard
from multilora_studio.arena.votes import Vote

SUFFIXES = (".json", ".csv")
VOTE_FIELDS = tuple(item.name for item in fields(Vote))


def board_rows(board: Leaderboard) -> list[dict[str, Any]]:
    """One row per standing, best first, with its win rate and whom it is not yet separable from."""
    return [
        {**asdict(s), "win_rate": s.win_rate, "not_separable_from": board.close_to(s.name)}
        for s in board.standings
    ]


def write_export(path: Path, votes: list[Vote], board: Leaderboard) -> None:
    """``votes`` (and, in JSON, ``board``) to ``path`` by its suffix."""
    if path.suffix == ".json":
        data = {
            "leaderboard": board_rows(board),
            "matrix": {"names": board.names, "scores": board.matrix, "games": board.games},
            "votes": [vote.to_dict() for vote in votes],
        }
        path.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
    elif path.suffix == ".csv":
        with path.open("w", newline="", encoding="utf-8") as file:
            writer = csv.DictWriter(file, VOTE_FIELDS)
            writer.writeheader()
            for vote in votes:
                writer.writerow({**vote.to_dict(), "settings": json.dumps(vote.settings, sort_keys=True)})
    else:
        raise ValueError(f"export to a file ending in {' or '.join(SUFFIXES)}, not {path.name}")


def read_export(path: Path) -> list[Vote]:
    """The votes of a file ``write_export`` wrote."""
    if path.suffix == ".json":
        return [Vote.from_dict(item) for item in json.loads(path.read_text(encoding="utf-8"))["votes"]]
    if path.suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as file:
            rows = list(csv.DictReader(file))
        return [
            Vote.from_dict({**row, "settings": json.loads(row["settings"]), "created": float(row["created"])})
            for row in rows
        ]
    raise ValueError(f"read votes from a file ending in {' or '.join(SUFFIXES)}, not {path.name}")
