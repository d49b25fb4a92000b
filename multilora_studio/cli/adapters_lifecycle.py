"""``adapters retire | reactivate | archive | restore | warm | warm-on-alias | import-scores |
history``: an adapter's life after it is registered (``adapters/registry_lifecycle.py``)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from multilora_studio.adapters.registry import Registry
from multilora_studio.adapters.score_import import read_model_card, read_scores

TRANSITIONS = {  # action: (help, Registry method)
    "retire": ("stop serving an adapter; it stays listed with its files", "retire"),
    "reactivate": ("serve a retired adapter again", "reactivate"),
    "archive": (
        "pack an adapter's files into one compressed archive with a manifest and free its folder",
        "archive",
    ),
    "restore": ("unpack an archived adapter, checked byte for byte; it comes back retired", "restore"),
}


def add_lifecycle_actions(actions: Any) -> None:
    """The lifecycle actions under ``adapters``."""
    for action, (text, _) in TRANSITIONS.items():
        parser = actions.add_parser(action, help=text, description=text[0].upper() + text[1:] + ".")
        parser.add_argument("name", help="adapter name or alias")
        parser.add_argument("--reason", default="", help="why (kept in the audit log)")
        parser.set_defaults(handler=run_transition, transition=action)
    for action, warm in (("warm", True), ("unwarm", False)):
        text = "read it into host RAM whenever an engine starts" if warm else "stop reading it at start"
        parser = actions.add_parser(action, help=text, description=text[0].upper() + text[1:] + ".")
        parser.add_argument("name", help="adapter name or alias")
        parser.set_defaults(handler=run_warm, warm=warm)
    alias_warm = actions.add_parser(
        "warm-on-alias",
        help="adapters to read into host RAM when a request first uses an alias",
        description="Set the adapters read into host RAM (not blocking the request) when a request "
        "first uses an alias after its engine started; without ADAPTER, show them.",
    )
    alias_warm.add_argument("alias", help="an alias of a library adapter")
    alias_warm.add_argument("adapters", nargs="*", metavar="ADAPTER", help="adapter name or alias")
    alias_warm.add_argument("--clear", action="store_true", help="read nothing on its first use")
    alias_warm.set_defaults(handler=run_alias_warm)
    scores = actions.add_parser(
        "import-scores",
        help="record evaluation scores from a JSON file or a model card (what the quality gate reads)",
        description='Record an adapter\'s evaluation scores from a JSON file: {"prompt_set", "prompts", '
        '"checked", "passed", "reference_logprob"} or a list of them; or the metrics of a Hugging Face '
        "model card's model-index (recorded without counts: the quality gate does not judge them).",
    )
    scores.add_argument("name", help="adapter name or alias")
    scores.add_argument("file", type=Path, nargs="?", default=None, help="the JSON file")
    scores.add_argument(
        "--model-card", type=Path, default=None, metavar="README", help="a model card (README.md) instead"
    )
    scores.set_defaults(handler=run_import_scores)
    history = actions.add_parser(
        "history",
        help="the audit log: every adapter's registrations, retirements, archives, restores and removals",
        description="The library's audit log, oldest first.",
    )
    history.add_argument("name", nargs="?", default=None, help="only this adapter (also after removal)")
    history.add_argument("--json", action="store_true", help="print JSON")
    history.set_defaults(handler=run_history)


def run_transition(args: argparse.Namespace) -> int:
    registry = Registry()
    record = getattr(registry, TRANSITIONS[args.transition][1])(args.name, args.reason)
    where = f" ({record.archive_path})" if record.archive_path is not None else ""
    print(f"{record.name}: {record.state}{where}")
    return 0


def run_warm(args: argparse.Namespace) -> int:
    record = Registry().set_warm(args.name, args.warm)
    print(f"{record.name}: {'warm at start' if record.warm else 'read on first use'}")
    return 0


def run_alias_warm(args: argparse.Namespace) -> int:
    registry = Registry()
    if args.clear and args.adapters:
        raise ValueError("give adapters or --clear, not both")
    if args.clear or args.adapters:
        record = registry.set_alias_warm(args.alias, args.adapters)
    else:
        record = registry.get(args.alias)
        if args.alias not in record.aliases:
            raise ValueError(f"{args.alias!r} is an adapter's name, not an alias")
    names = dict(record.alias_warm).get(args.alias, ())
    print(f"{args.alias} ({record.name}): " + (", ".join(names) if names else "reads nothing on first use"))
    return 0


def run_import_scores(args: argparse.Namespace) -> int:
    if (args.file is None) == (args.model_card is None):
        raise ValueError("give a JSON file or --model-card README.md (one of them)")
    registry = Registry()
    record = registry.get(args.name)
    if args.model_card is not None:
        scores = read_model_card(args.model_card, record.name, record.base_digest)
        if not scores:
            raise ValueError(f"{args.model_card}: no model-index results in its front matter; none recorded")
    else:
        scores = read_scores(args.file, record.name, record.base_digest)
    registry.record_eval_scores(scores)
    for score in scores:
        if score.checked is None:
            print(f"{record.name}: {score.label}")
            continue
        rate = f"{score.pass_rate:.0%}" if score.pass_rate is not None else "no checks"
        print(f"{record.name}: {score.prompt_set} {score.passed}/{score.checked} passed ({rate})")
    if any(score.checked is None for score in scores):
        print(
            "These scores carry no counts: serve --min-pass-rate judges the newest evaluation with "
            "counts, and serves an adapter that has none with a warning."
        )
    return 0


def run_history(args: argparse.Namespace) -> int:
    events = Registry().events(args.name)
    if args.json:
        print(json.dumps([{**vars_of(e), "time": stamp(e.time)} for e in events], indent=2))
        return 0
    if not events:
        print("no events" + (f" for {args.name!r}" if args.name else ""))
        return 0
    for event in events:
        reason = f"  ({event.reason})" if event.reason else ""
        print(f"{stamp(event.time)}  {event.name}  {event.event}{reason}")
    return 0


def vars_of(event: Any) -> dict:
    return {"name": event.name, "adapter_id": event.adapter_id, "event": event.event, "reason": event.reason}


def stamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))
