"""``multilora-studio arena``: blind pairwise votes between adapters (and the base) in the terminal,
and the leaderboard of the votes recorded.

Each round prints one prompt's two answers as Model A and Model B (sides drawn, names hidden),
reads the vote as one line (1 A is better, 2 B is better, 3 tie, 4 both bad; q stops) and only then
prints the names. Votes go to ``arena.sqlite3`` in the data directory, as the window's do.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from multilora_studio.adapters.lora_modules import parse_lora_modules
from multilora_studio.arena import (
    PERSON,
    VERDICT_WORDS,
    VERDICTS,
    ArenaSettings,
    Matchmaker,
    Round,
    Vote,
    VoteStore,
    agreement_lines,
    board_lines,
    check_contenders,
    judge_round,
    leaderboard,
    people,
    prompt_set_prompts,
    run_round,
    write_export,
)
from multilora_studio.cli.shared import (
    DEMO_PROMPTS,
    Subcommands,
    add_adapters,
    add_demo_adapters_flag,
    add_engine_arguments,
    add_other_base_flag,
    engine_config,
    library_for,
    print_progress,
    prompt_set_file,
)
from multilora_studio.engine import Engine, Prompt
from multilora_studio.run_records import BASE, AdapterDigests

STOP = "q"
KEYS = {str(key): verdict for key, verdict in enumerate(VERDICTS, 1)}
QUESTION = ", ".join(f"{key} {VERDICT_WORDS[verdict]}" for key, verdict in KEYS.items())


def add_arena_command(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "arena",
        help="vote blind between two adapters' answers, and rank adapters by the votes",
        description="Show rounds of one prompt answered by two contenders in one batched run, their "
        "names hidden and sides drawn; vote with one line per round (1: A is better, 2: B is better, "
        f"3: tie, 4: both bad, {STOP}: stop) and the names show. Without prompts from --prompts, "
        "each round first reads its prompt as a line (an empty line stops). Votes are stored with "
        "the window's; --board prints the leaderboard of people's votes on this base model.",
    )
    parser.add_argument(
        "contenders",
        nargs="*",
        metavar="CONTENDER",
        help=f"adapter names, '{BASE}' for the base model: two or more (none: only --board / --export)",
    )
    parser.add_argument(
        "--prompts",
        type=prompt_set_file,
        default=None,
        help=f"a prompt set of Evaluate (.jsonl or .csv; '{DEMO_PROMPTS}': the demo adapters' example set), "
        "its prompts in random order (default: each round reads its prompt from stdin)",
    )
    parser.add_argument("--rounds", type=int, default=None, help="stop after this many votes")
    parser.add_argument(
        "--judge",
        default=None,
        metavar="MODEL_OR_ADAPTER",
        help=f"a served model ('{BASE}' or an adapter) that votes on each round too, after you; its "
        "votes are recorded apart and its agreement with people is on the board",
    )
    parser.add_argument("--board", action="store_true", help="print the leaderboard at the end")
    parser.add_argument(
        "--export",
        type=Path,
        default=None,
        metavar="FILE",
        help="write the votes on this base model (.csv), or them and the leaderboard (.json)",
    )
    defaults = ArenaSettings()
    parser.add_argument(
        "--max-tokens", type=int, default=defaults.max_tokens, help="new tokens per answer at most"
    )
    parser.add_argument("--temperature", type=float, default=defaults.temperature, help="of both sides")
    parser.add_argument("--top-p", type=float, default=defaults.top_p, help="of both sides")
    parser.add_argument("--raw", action="store_true", help="send text prompts as plain text, not as chat")
    add_other_base_flag(parser)
    add_engine_arguments(parser, comparing=True)
    add_demo_adapters_flag(parser)
    parser.set_defaults(handler=run_arena)


def run_arena(args: argparse.Namespace) -> int:
    if args.rounds is not None and args.rounds < 1:
        raise ValueError(f"--rounds is at least 1, got {args.rounds}")
    if args.export is not None and args.export.suffix not in (".json", ".csv"):
        raise ValueError(f"--export writes a .json or .csv file, not {args.export.name}")
    store = VoteStore()
    if not args.contenders:
        if not (args.board or args.export):
            raise ValueError(f"name two contenders or more (adapters or '{BASE}'), or ask for --board")
        from multilora_studio.engine.model.model_source import describe_model

        report(args, store, describe_model(args.model, progress=print_progress).digest)
        return 0
    settings = ArenaSettings(args.max_tokens, args.temperature, args.top_p, chat=not args.raw)
    prompts = prompt_set_prompts(args.prompts) if args.prompts is not None else None
    if prompts == []:
        raise ValueError(f"the prompt set {args.prompts} has no prompts")
    modules = parse_lora_modules(args.lora_modules)
    offer = args.model is None and not args.no_demo_adapters  # the demo adapters are for the embedded model
    served = [name for name in dict.fromkeys([*args.contenders, args.judge or BASE]) if name != BASE]
    registry = library_for(served, modules, offer)
    with Engine(engine_config(args), progress=print_progress) as engine:
        add_adapters(engine, served, modules, registry, args.allow_other_base)
        contenders = check_contenders(engine, args.contenders)
        play(engine, contenders, prompts, settings, store, args)
        base_digest = engine.base_digest
    report(args, store, base_digest)
    return 0


def play(
    engine: Engine,
    contenders: list[str],
    prompts: list[Prompt] | None,
    settings: ArenaSettings,
    store: VoteStore,
    args: argparse.Namespace,
) -> None:
    """Rounds until ``--rounds`` votes, ``q``, the end of stdin or an empty typed prompt."""
    rng = random.Random()
    matchmaker, digests = Matchmaker(contenders, rng), AdapterDigests()
    votes: list[Vote] = []
    order: list[Prompt] = []
    while args.rounds is None or len(votes) < args.rounds:
        if prompts is not None:
            order = order or rng.sample(prompts, len(prompts))
            prompt: Prompt | None = order.pop()
        else:
            prompt = ask("prompt (an empty line stops): ")
        if not prompt:
            break
        left, right = matchmaker.next(votes)
        shown = run_round(engine, prompt, left, right, settings, digests)
        print(round_text(len(votes) + 1, shown), flush=True)
        verdict = ask_vote()
        if verdict is None:
            break
        vote = shown.vote(verdict, PERSON)
        store.add([vote])
        votes.append(vote)
        print(f"A: {shown.left}   B: {shown.right}   your vote: {said(vote)}")
        if args.judge is not None:
            judged = judge_round(engine, args.judge, shown)
            store.add([judged])
            agrees = "agrees" if judged.verdict == verdict else "disagrees"
            print(f"{judged.voter}: {said(judged)}; it {agrees} with you")
    print(f"\n{len(votes)} votes recorded in {store.path}")


def round_text(number: int, shown: Round) -> str:
    return "\n".join(
        [
            f"\n== Round {number}: {shown.prompt}",
            "-- Model A",
            shown.output_left.strip(),
            "-- Model B",
            shown.output_right.strip(),
        ]
    )


def said(vote: Vote) -> str:
    """A vote in words, with the winner's name when there is one."""
    return VERDICT_WORDS[vote.verdict] + (f" ({vote.winner})" if vote.winner is not None else "")


def ask(question: str) -> str | None:
    """One line of stdin, stripped (None at its end); piped input is echoed after the question."""
    print(question, end="", flush=True)
    line = sys.stdin.readline()
    if not sys.stdin.isatty():
        print(line.rstrip("\n"))
    return line.strip() if line else None


def ask_vote() -> str | None:
    """The verdict typed (asked again after anything else); None for ``q`` or the end of stdin."""
    while True:
        answer = ask(f"vote ({QUESTION}; {STOP} stops): ")
        if answer is None or answer.lower() == STOP:
            return None
        if answer in KEYS:
            return KEYS[answer]
        print(f"type 1, 2, 3 or 4 (or {STOP}), not {answer!r}")


def report(args: argparse.Namespace, store: VoteStore, base_digest: str) -> None:
    """``--board`` and ``--export`` over the votes on ``base_digest``'s weights."""
    votes = store.votes(base_digest=base_digest)
    board = leaderboard(people(votes))
    if args.board:
        print("\n" + "\n".join([*board_lines(board), *agreement_lines(votes)]))
    if args.export is not None:
        write_export(args.export, votes, board)
        print(f"export: {args.export}")
