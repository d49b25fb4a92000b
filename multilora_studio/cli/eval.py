"""``multilora-studio eval``: a prompt set through several adapters (and the base), scored per adapter."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from multilora_studio.adapters.lora_modules import parse_lora_modules
from multilora_studio.adapters.registry import Registry
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
from multilora_studio.demo import demo_adapter_dirs, demo_prompt_set
from multilora_studio.engine import Engine, EngineConfig
from multilora_studio.evaluate import (
    BASE,
    CHECK_KINDS,
    FORMATS,
    EvalResults,
    EvalSettings,
    Rerun,
    changed_cells,
    load_prompt_set,
    read_results_json,
    record_scores,
    run_eval,
    save_results,
    write_export,
)
from multilora_studio.evaluate.export import score_lines
from multilora_studio.run_records import AdapterDigests, EngineRecord

SETTING_FLAGS = {
    "max_tokens": "--max-tokens",
    "temperature": "--temperature",
    "top_p": "--top-p",
    "seed": "--seed",
    "chat": "--chat",
    "batch_prompts": "--batch-prompts",
}  # EvalSettings' fields and their flags: None when not given (EvalSettings' default; a rerun's own)


def add_eval_command(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="evaluate adapters on your own prompt set",
        description="Run every prompt of a JSONL or CSV prompt set through each adapter and the base "
        "model, in shared batches, check each output and print the per-adapter scores. The results "
        "are saved as JSON and each library adapter's scores are recorded in the library.",
    )
    parser.add_argument(
        "--prompts",
        type=prompt_set_file,
        default=None,
        help=f"the prompt set (.jsonl or .csv; '{DEMO_PROMPTS}': the demo adapters' example set, "
        "one prompt per adapter); with --rerun: where it moved",
    )
    parser.add_argument(
        "--rerun",
        type=Path,
        default=None,
        metavar="RESULTS.json",
        help="run a saved evaluation again: its prompt set (refused if the file changed), adapters, "
        "settings and engine dtype, slots, rank and batch invariance (refused on another base)",
    )
    parser.add_argument(
        "--allow-changed-adapters",
        action="store_true",
        help="with --rerun: run even when an adapter's weights differ from the recorded digest",
    )
    parser.add_argument(
        "--adapters",
        default=None,
        help=f"comma-separated adapter names; '{BASE}' is the base model (default: {BASE}; with "
        f"--prompts {DEMO_PROMPTS} on the embedded model: {BASE} and the demo adapters)",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="folder of the results (default: evaluations/ in the data dir)"
    )
    parser.add_argument("--format", choices=FORMATS, default=None, help="also write an export in this format")
    parser.add_argument(
        "--check",
        default=None,
        help=f"default check of rows without one: {', '.join(CHECK_KINDS)} or a JSON check object",
    )
    defaults = EvalSettings()
    parser.add_argument(
        "--chat", action="store_true", default=None, help="send text prompts as one user message"
    )
    parser.add_argument(
        "--max-tokens", type=int, default=None, help=f"new tokens per answer at most ({defaults.max_tokens})"
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=None,
        help=f"0: greedy, the same answer every run ({defaults.temperature:g})",
    )
    parser.add_argument(
        "--top-p",
        type=float,
        default=None,
        help=f"nucleus sampling: keep this much probability ({defaults.top_p:g})",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the sampling (a sampled run without one draws one and records it)",
    )
    parser.add_argument(
        "--batch-prompts",
        type=int,
        default=None,
        help=f"prompts per batch, each with every adapter ({defaults.batch_prompts})",
    )
    parser.add_argument("--no-record", action="store_true", help="do not record the scores in the library")
    add_other_base_flag(parser)
    add_engine_arguments(parser, comparing=True)
    add_demo_adapters_flag(parser)
    parser.set_defaults(handler=run_eval_command)


def default_check(text: str | None) -> Any:
    """``--check``: a kind name or a JSON check object (checked against each row it applies to)."""
    if text is None or not text.lstrip().startswith("{"):
        return text
    try:
        return json.loads(text)
    except ValueError as error:
        raise ValueError(f"--check is a check kind or a JSON object: {error}") from None


def run_eval_command(args: argparse.Namespace) -> int:
    if args.rerun is not None:
        return rerun_command(args)
    if args.prompts is None:
        raise ValueError("give the prompt set with --prompts FILE (or a saved evaluation with --rerun)")
    prompt_set = load_prompt_set(args.prompts, default_check(args.check))
    modules = parse_lora_modules(args.lora_modules)
    offer = args.model is None and not args.no_demo_adapters  # the demo adapters are for the embedded model
    default = [BASE, *demo_adapter_dirs()] if offer and args.prompts == demo_prompt_set() else [BASE]
    given_names = (args.adapters or ",".join(default)).split(",")
    names = list(dict.fromkeys(name.strip() for name in given_names if name.strip()))
    if not names:
        raise ValueError("--adapters names at least one adapter or 'base'")
    given = {name: getattr(args, name) for name in SETTING_FLAGS if getattr(args, name) is not None}
    settings = EvalSettings(**given)
    adapters = [name for name in names if name != BASE]
    registry = library_for(adapters, modules, offer)
    with Engine(engine_config(args), progress=print_progress) as engine:
        add_adapters(engine, adapters, modules, registry, args.allow_other_base)
        results = run_eval(engine, prompt_set, names, settings, progress=print_progress)
    return report(args, results, registry)


def rerun_command(args: argparse.Namespace) -> int:
    """``--rerun``: the saved evaluation again, on the recorded engine settings, checked first."""
    taken = [SETTING_FLAGS[name] for name in SETTING_FLAGS if getattr(args, name) is not None]
    taken += [
        flag for name, flag in (("adapters", "--adapters"), ("check", "--check")) if getattr(args, name)
    ]
    if taken:
        raise ValueError(
            f"--rerun runs the saved adapters and settings; leave out {', '.join(taken)} "
            "(or run a new evaluation with --prompts)"
        )
    rerun = Rerun.of(read_results_json(args.rerun), args.prompts)
    modules = {**recorded_folders(rerun), **parse_lora_modules(args.lora_modules)}
    offer = args.model is None and not args.no_demo_adapters
    registry = library_for(rerun.adapters, modules, offer)
    digests = AdapterDigests()
    with Engine(rerun_config(engine_config(args), rerun.saved.engine), progress=print_progress) as engine:
        rerun.check_base(engine)  # before the adapters, which the library checks against the base
        add_adapters(engine, rerun.adapters, modules, registry, args.allow_other_base)
        for warning in rerun.check_engine(engine, digests, args.allow_changed_adapters):
            print(f"warning: {warning}", file=sys.stderr)
        results = rerun.run(engine, print_progress, digests=digests)
    changed = changed_cells(rerun.saved, results)
    print(f"rerun of {args.rerun}: {len(results.cells) - changed} of {len(results.cells)} cells as saved\n")
    return report(args, results, registry)


def recorded_folders(rerun: Rerun) -> dict[str, Path]:
    """The recorded folders of adapters the library does not hold by that name and that still exist."""
    folders = {
        name: Path(folder) for name, folder in rerun.saved.adapter_folders.items() if Path(folder).is_dir()
    }
    if not folders:
        return {}
    registry = Registry()
    return {name: folder for name, folder in folders.items() if registry.find(name) is None}


def rerun_config(config: EngineConfig, record: EngineRecord | None) -> EngineConfig:
    """``config`` with the recorded dtype, slots, rank and batch invariance (as given without a record)."""
    if record is None:
        return config
    return dataclasses.replace(
        config,
        dtype=record.dtype,
        max_loras=record.max_loras,
        max_cpu_loras=None if config.max_cpu_loras is None else max(config.max_cpu_loras, record.max_loras),
        max_lora_rank=record.max_lora_rank,
        batch_invariant=config.batch_invariant if record.batch_invariant is None else record.batch_invariant,
    )


def report(args: argparse.Namespace, results: EvalResults, registry: Registry | None) -> int:
    """Save the results, print the scores and where they went, write the export, record the scores."""
    saved = save_results(results, args.out)
    print(f"model: {results.model}   prompt set: {results.prompt_set} ({len(results.prompts)} prompts)\n")
    print("\n".join(score_lines(results)))
    print(f"\nresults: {saved}")
    if args.format is not None:  # JSON: the results file is the export
        target = (
            saved if args.format == "json" else write_export(results, saved.with_suffix("." + args.format))
        )
        print(f"export: {target}")
    if registry is not None and not args.no_record:
        recorded = record_scores(registry, results, saved)
        if recorded:
            print(f"recorded in the library: {', '.join(recorded)}")
    return 0
