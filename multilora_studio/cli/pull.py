"""``multilora-studio pull``: an adapter (or a base model) from the Hugging Face Hub into the library."""

from __future__ import annotations

import argparse

from multilora_studio.adapters.registry import Registry
from multilora_studio.cli.shared import (
    Subcommands,
    add_base_arguments,
    add_naming_arguments,
    describe_base,
    print_progress,
)


def add_pull_command(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "pull",
        help="pull an adapter (or a base model) from the Hugging Face Hub",
        description="Download ORG/NAME[@REVISION] into the Hugging Face cache, validate it against the "
        "base model and add it to the adapter library. The revision (branch, tag or commit) is pinned "
        "to its commit. HF_ENDPOINT, HF_HUB_CACHE and HF_HUB_OFFLINE=1 (use the cache only) apply.",
    )
    parser.add_argument(
        "repo", metavar="REPO_ID[@REV]", help="Hub repository, optionally @branch, @tag or @sha"
    )
    add_naming_arguments(parser)
    add_base_arguments(parser)
    parser.set_defaults(handler=run_pull)


def run_pull(args: argparse.Namespace) -> int:
    from multilora_studio.adapters.pull import pull  # huggingface_hub reads HF_* settings at import

    result = pull(
        args.repo,
        Registry(),
        lambda: describe_base(args.model),
        name=args.name,
        aliases=args.alias,
        notes=args.notes,
        max_rank=args.max_lora_rank,
        progress=print_progress,
    )
    if result.adapter is not None:
        state = "already in the library as" if result.already_registered else "added to the library as"
        print(f"{result.repo_id}@{result.revision}: {state} {result.adapter.name!r}")
    else:
        print(f"base model {result.repo_id}@{result.revision} in {result.path}")
        print(f"use it with: --model {result.path}")
    return 0
