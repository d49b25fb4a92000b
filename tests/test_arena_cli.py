"""``multilora-studio arena`` in a terminal: rounds with the names hidden until the vote read from
stdin, votes stored (a judge's apart), the leaderboard and its export."""

from __future__ import annotations

import json

from multilora_studio.arena import PERSON, VoteStore, read_export
from multilora_studio.arena.votes import judge_voter
from multilora_studio.cli import main
from multilora_studio.run_records import BASE

ADAPTERS = ("tiny-r4-qv", "tiny-r8-all")


class Typed:
    """stdin of typed ``lines``: each read keeps what stdout showed since the read before."""

    def __init__(self, capsys, lines: list[str]) -> None:
        self.capsys = capsys
        self.lines = list(lines)
        self.shown: list[str] = []  # stdout before each read

    def readline(self) -> str:
        self.shown.append(self.capsys.readouterr().out)
        return self.lines.pop(0) + "\n" if self.lines else ""

    def isatty(self) -> bool:
        return False


def arena(capsys, monkeypatch, typed: list[str], *args: str) -> tuple[int, Typed, str]:
    stdin = Typed(capsys, typed)
    monkeypatch.setattr("sys.stdin", stdin)
    code = main(["arena", *args])
    return code, stdin, capsys.readouterr().out


def engine_flags(tiny_model_dir, tiny_adapters) -> list[str]:
    modules = [f"{name}={tiny_adapters[name]}" for name in ADAPTERS]
    return [
        "--model",
        str(tiny_model_dir),
        "--device",
        "cpu",
        "--max-lora-rank",
        "32",
        "--lora-modules",
        *modules,
    ]


def test_rounds_hide_the_names_until_the_vote_and_the_board_ranks_the_votes(
    capsys, monkeypatch, tmp_path, tiny_model_dir, tiny_adapters
):
    monkeypatch.setenv("MULTILORA_STUDIO_HOME", str(tmp_path / "home"))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("Hello", "The sky is")))
    export = tmp_path / "arena.json"
    votes = ["1", "2", "x", "3", "4"]  # "x" is asked again
    code, stdin, end = arena(
        capsys,
        monkeypatch,
        votes,
        BASE,
        *ADAPTERS,
        "--prompts",
        str(prompts),
        "--max-tokens",
        "4",
        "--judge",
        BASE,
        "--board",
        "--export",
        str(export),
        *engine_flags(tiny_model_dir, tiny_adapters),
    )
    assert code == 0, end
    rounds = [read.rsplit("== Round", 1)[-1] for read in stdin.shown if "== Round" in read]
    assert len(rounds) == 5  # the fifth one's vote met the end of stdin
    for round_shown in rounds:  # each round as shown before its vote is read
        assert "-- Model A" in round_shown and "-- Model B" in round_shown
        assert not any(name in round_shown for name in ADAPTERS), round_shown
    reveals = "".join(stdin.shown[1:]) + end
    assert reveals.count("your vote:") == 4 and reveals.count("judge:base:") == 4
    stored = VoteStore(tmp_path / "home").votes()
    people = [vote for vote in stored if vote.voter == PERSON]
    assert [vote.verdict for vote in people] == ["a", "b", "tie", "both_bad"]
    assert len([vote for vote in stored if vote.voter == judge_voter(BASE)]) == 4
    board = end.split("votes recorded in", 1)[1]
    assert "4 votes; Bradley-Terry ratings" in board and "95 % interval" in board
    assert all(name in board for name in (BASE, *ADAPTERS))
    assert "not yet separable:" in board and "judge:base agreed with people on" in board
    assert len(read_export(export)) == len(stored)


def test_typed_prompts_are_read_before_each_round_and_the_board_reads_stored_votes(
    capsys, monkeypatch, tmp_path, tiny_model_dir, tiny_adapters
):
    monkeypatch.setenv("MULTILORA_STUDIO_HOME", str(tmp_path / "home"))
    flags = engine_flags(tiny_model_dir, tiny_adapters)
    typed = ["Hello", "1", "Once upon a time", "q"]  # q stops before the second vote
    code, _, out = arena(capsys, monkeypatch, typed, *ADAPTERS, "--max-tokens", "3", *flags)
    assert code == 0 and "1 votes recorded" in out
    code, _, board = arena(capsys, monkeypatch, [], "--board", "--model", str(tiny_model_dir))
    assert code == 0 and "1 votes; Bradley-Terry" in board and ADAPTERS[0] in board
    csv = tmp_path / "votes.csv"
    assert main(["arena", "--export", str(csv), "--model", str(tiny_model_dir)]) == 0
    assert [vote.prompt for vote in read_export(csv)] == ["Hello"]


def test_the_arena_refuses_what_it_cannot_run(capsys, monkeypatch, tmp_path, tiny_model_dir, tiny_adapters):
    monkeypatch.setenv("MULTILORA_STUDIO_HOME", str(tmp_path / "home"))
    assert main(["arena"]) == 1
    assert "name two contenders or more" in capsys.readouterr().err
    flags = engine_flags(tiny_model_dir, tiny_adapters)
    assert main(["arena", BASE, "--no-demo-adapters", *flags]) == 1
    assert "pick at least two contenders" in capsys.readouterr().err
