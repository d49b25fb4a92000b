"""``multilora-studio adapters ...``: list, add, remove, pin and inspect the library on the command line."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import operator
import time
from collections.abc import Callable
from pathlib import Path

from multilora_studio.adapters.registry import Registry
from multilora_studio.adapters.registry_schema import AdapterRecord, EvalScoreRecord
from multilora_studio.cli.adapters_lifecycle import add_lifecycle_actions
from multilora_studio.cli.shared import (
    Subcommands,
    add_base_arguments,
    add_demo_adapters_flag,
    add_naming_arguments,
    describe_base,
)
from multilora_studio.default_model import DEFAULT_MODEL_REPO
from multilora_studio.demo import offer_demo_adapters

BASE_FLAGS = {"ok": "", "mismatch": " (!)", "unknown": " (?)"}  # by AdapterRecord.base_status
RECORD_FIELDS = tuple(field.name for field in dataclasses.fields(AdapterRecord))
record_values = operator.attrgetter(*RECORD_FIELDS)
JSON_KEYS = tuple("path" if name == "folder" else name for name in RECORD_FIELDS)  # an adapter's, in order
JSON_LINE = json.JSONEncoder(check_circular=False).encode  # json.dumps less a check per dict: no cycles here


def add_adapters_command(subparsers: Subcommands) -> None:
    adapters = subparsers.add_parser(
        "adapters",
        help="list, add, remove, pin and inspect the adapters of the library",
        description="The adapter library: one SQLite file in the user data directory.",
    )
    actions = adapters.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="list the library", description="List the library's adapters.")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.add_argument("--model", default=None, help="flag adapters validated against another base")
    add_demo_adapters_flag(listing)
    listing.set_defaults(handler=run_list)

    add = actions.add_parser(
        "add",
        help="validate a PEFT folder (or a GGUF LoRA file) and copy it into the library",
        description="Validate a PEFT adapter folder against the base model and copy it into the library. "
        "A llama.cpp GGUF LoRA adapter (FILE.gguf, as convert_lora_to_gguf.py writes it) is converted "
        "into a PEFT folder first and validated the same way.",
    )
    add.add_argument(
        "path",
        type=Path,
        help="PEFT folder (adapter_config.json + adapter_model.safetensors) or GGUF LoRA file (.gguf)",
    )
    add_naming_arguments(add)
    add_base_arguments(add)
    add.set_defaults(handler=run_add)

    for action, text, handler in (
        ("remove", "remove an adapter (an imported copy is deleted)", run_remove),
        ("pin", "keep the adapter in its GPU slot once loaded", run_pin),
        ("unpin", "let the adapter's GPU slot be reused again", run_unpin),
        ("show", "show everything the library records about an adapter", run_show),
    ):
        parser = actions.add_parser(action, help=text, description=text[0].upper() + text[1:] + ".")
        parser.add_argument("name", help="adapter name or alias")
        if action == "show":
            parser.add_argument("--json", action="store_true", help="print JSON")
            parser.add_argument("--model", default=None, help="check against this base model folder")
        parser.set_defaults(handler=handler)

    rename = actions.add_parser(
        "rename", help="give an adapter a new name", description="Give an adapter a new name (aliases stay)."
    )
    rename.add_argument("name", help="adapter name or alias")
    rename.add_argument("new_name", help="the new name")
    rename.set_defaults(handler=run_rename)

    search = actions.add_parser(
        "search",
        help="search the Hub for adapters of a base model",
        description="Search the Hugging Face Hub for adapters of a base model (its base_model:adapter: tag).",
    )
    search.add_argument("text", nargs="?", default=None, help="words the repository id contains")
    search.add_argument("--base", default=DEFAULT_MODEL_REPO, help="base model repository id on the Hub")
    search.add_argument(
        "--limit", type=int, default=20, help="repositories listed at most, most downloaded first"
    )
    search.set_defaults(handler=run_search)
    add_lifecycle_actions(actions)


def run_add(args: argparse.Namespace) -> int:
    registry = Registry()
    if args.path.suffix.lower() == ".gguf" and not args.path.is_dir():
        from multilora_studio.adapters.gguf_import import import_gguf_adapter  # torch: only for GGUF

        registry.check_names(args.name or args.path.stem, args.alias)
        importer: Callable[..., AdapterRecord] = functools.partial(import_gguf_adapter, registry)
    else:
        registry.check_names(args.name or args.path.expanduser().resolve().name, args.alias)
        importer = registry.import_folder
    record = importer(
        args.path,
        describe_base(args.model),
        name=args.name,
        aliases=args.alias,
        notes=args.notes,
        max_rank=args.max_lora_rank,
    )
    print(
        f"added {record.name!r}: rank {record.rank_label}, {', '.join(record.targets)}, "
        f"{_size(record.size_bytes)}"
    )
    return 0


def run_list(args: argparse.Namespace) -> int:
    registry = Registry()
    base = describe_base(args.model) if args.model else None
    if not args.no_demo_adapters:
        offer_demo_adapters(registry, base or (lambda: describe_base(None)))
    records = registry.list_adapters()
    digest = base.digest if base is not None else None
    evaluated = registry.latest_eval_scores()
    if args.json:  # one adapter a line: the C encoder (indent= would take the slow Python one)
        lines = [JSON_LINE(_as_json(r, digest, evaluated.get(r.name))) for r in records]
        print("[\n" + ",\n".join(lines) + "\n]" if lines else "[]")
        return 0
    if not records:
        print("the library is empty; add adapters with: multilora-studio adapters add PATH | pull REPO_ID")
        return 0
    rows = [("NAME", "STATE", "RANK", "TARGETS", "SIZE", "PIN", "BASE", "LAST EVAL", "SOURCE")]
    for r in records:
        flag = "" if digest is None else BASE_FLAGS[r.base_status(digest)]
        rows.append(
            (r.name, r.state, r.rank_label, ",".join(r.targets), _size(r.size_bytes),
             "yes" if r.pinned else "", r.base_name + flag, _eval_label(evaluated.get(r.name)),
             r.source_label)
        )  # fmt: skip
    widths = [max(map(len, column)) for column in zip(*rows, strict=True)]
    line = "  ".join(f"{{:<{width}}}" for width in widths)
    print("\n".join(line.format(*row).rstrip() for row in rows))
    if digest is not None and any(r.base_status(digest) == "mismatch" for r in records):
        print("(!) validated against other base weights: refused unless overridden")
    return 0


def run_show(args: argparse.Namespace) -> int:
    registry = Registry()
    record = registry.get(args.name)
    digest = describe_base(args.model).digest if args.model else None
    data = _as_json(record, digest)
    scores = registry.eval_scores(record.name)
    if args.json:
        data["evaluations"] = [_score_json(score) for score in scores]
        print(json.dumps(data, indent=2))
        return 0
    for key, value in data.items():
        shown = ", ".join(value) if isinstance(value, list) else ("" if value is None else value)
        print(f"{key + ':':20} {shown}")
    for score in scores:
        print(f"{'evaluation:':20} {_eval_label(score)}, {_time(score.created)}, {score.results_path or '-'}")
    return 0


def run_remove(args: argparse.Namespace) -> int:
    record = Registry().remove(args.name)
    print(f"removed {record.name!r}")
    return 0


def run_rename(args: argparse.Namespace) -> int:
    record = Registry().rename(args.name, args.new_name)
    print(f"{args.name!r} is now called {record.name!r}")
    return 0


def run_pin(args: argparse.Namespace) -> int:
    record = Registry().set_pinned(args.name, True)
    print(f"pinned {record.name!r}")
    return 0


def run_unpin(args: argparse.Namespace) -> int:
    record = Registry().set_pinned(args.name, False)
    print(f"unpinned {record.name!r}")
    return 0


def run_search(args: argparse.Namespace) -> int:
    from multilora_studio.adapters.hub import search_adapters

    if args.limit < 1:
        raise ValueError("--limit must be at least 1")
    found = search_adapters(args.base, args.text, args.limit)
    if not found:
        print(f"no adapters of {args.base} found" + (f" matching {args.text!r}" if args.text else ""))
    for model in found:
        print(f"{model.repo_id}  downloads={model.downloads or 0}  likes={model.likes or 0}")
    return 0


def _eval_label(score: EvalScoreRecord | None) -> str:
    """``EvalScoreRecord.label``, or '' when never evaluated."""
    return "" if score is None else score.label


def _score_json(score: EvalScoreRecord) -> dict:
    data = dataclasses.asdict(score)
    data["pass_rate"] = score.pass_rate
    data["created"] = _time(score.created)
    return data


def _as_json(record: AdapterRecord, digest: str | None, latest: EvalScoreRecord | None = None) -> dict:
    data = dict(zip(JSON_KEYS, record_values(record), strict=False))  # as many; no deep copy
    data["archive_path"] = str(record.archive_path) if record.archive_path is not None else None
    data["aliases"] = list(record.aliases)
    data["targets"] = list(record.targets)
    data["created"] = _time(record.created)
    data["last_used"] = _time(record.last_used) if record.last_used else None
    if digest is not None:
        data["base_status"] = record.base_status(digest)
    if latest is not None:
        data["last_eval"] = _score_json(latest)
    return data


def _time(stamp: float) -> str:
    return _second(int(stamp))


@functools.lru_cache(maxsize=1024)
def _second(stamp: int) -> str:
    """The local time of a whole second (adapters imported together share their seconds)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


def _size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{value:.0f} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"
