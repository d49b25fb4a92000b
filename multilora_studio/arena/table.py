"""The leaderboard as text, the same in the window and the terminal: each standing's cells, the
table's lines, the not yet separable pairs, and each judge's agreement with people."""

from __future__ import annotations

from multilora_studio.arena.leaderboard import Leaderboard, Standing, agreement
from multilora_studio.arena.votes import JUDGE_PREFIX, Vote

COLUMNS = ("Contender", "Rating", "95 % interval", "Win rate", "Votes", "W / T / L", "Not yet separable from")


def summary(board: Leaderboard) -> str:
    if not board.votes:
        return "No votes yet."
    return f"{board.votes} votes; Bradley-Terry ratings (Elo scale, mean 1000) with bootstrap 95 % intervals"


def standing_cells(board: Leaderboard, s: Standing) -> tuple[str, ...]:
    """One row of the table, as ``COLUMNS`` names its cells."""
    return (
        s.name,
        f"{s.rating:.0f}",
        f"{s.low:.0f} – {s.high:.0f}",
        f"{s.win_rate:.0%}",
        str(s.votes),
        f"{s.wins} / {s.ties} / {s.losses}",
        ", ".join(board.close_to(s.name)) or "-",
    )


def inseparable_pairs(board: Leaderboard) -> list[str]:
    """``first ~ second`` for each pair whose ratings are not yet separable, best first."""
    names = board.names
    return [
        f"{first} ~ {second}"
        for i, first in enumerate(names)
        for second in names[i + 1 :]
        if not board.separable(first, second)
    ]


def board_lines(board: Leaderboard) -> list[str]:
    """The table in aligned columns under its summary, then the not yet separable pairs."""
    if not board.votes:
        return [summary(board)]
    rows = [COLUMNS, *(standing_cells(board, s) for s in board.standings)]
    widths = [max(len(row[column]) for row in rows) for column in range(len(COLUMNS))]
    lines = [summary(board), ""]
    lines += [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    pairs = inseparable_pairs(board)
    lines += ["", f"not yet separable: {', '.join(pairs)}" if pairs else "every pair is separable"]
    return lines


def judges(votes: list[Vote]) -> list[str]:
    """The judges that voted in ``votes`` (``judge:<model>``), sorted."""
    return sorted({vote.voter for vote in votes if vote.voter.startswith(JUDGE_PREFIX)})


def agreement_lines(votes: list[Vote]) -> list[str]:
    """For each judge in ``votes``: on how many of the rounds people voted on it voted as they did."""
    lines = []
    for judge in judges(votes):
        agreed, shared = agreement(votes, judge)
        rate = f" ({agreed / shared:.0%})" if shared else ""
        lines.append(f"{judge} agreed with people on {agreed} of {shared} rounds{rate}")
    return lines
