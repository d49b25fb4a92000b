"""``multilora-studio advise``: cache sizes, pins and merge candidates from a server's recorded
traffic (``bench/advisor.py``)."""

from __future__ import annotations

import argparse
import urllib.request
from pathlib import Path

from multilora_studio.bench.advisor import advice_json, advise, parse_trace, read_trace, render
from multilora_studio.cli.shared import Subcommands


def add_advise_command(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "advise",
        help="recommend max_loras, max_cpu_loras, pins and merges from a server's recorded traffic",
        description="Replay a server's recorded requests (GET /v1/usage/trace) through a model of the "
        "engine's GPU slots and host tier, and recommend the settings with their predicted hit rates, "
        "disk loads and TTFT p95.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", type=Path, help="a saved /v1/usage/trace file (JSON lines)")
    source.add_argument("--url", help="a running server's base URL (http://HOST:PORT), read now")
    parser.add_argument("--api-key", default=None, help="with --url: an admin key of that server")
    parser.add_argument(
        "--max-loras-limit", type=int, default=128, help="the most GPU slots the GPU's memory allows"
    )
    parser.add_argument(
        "--recorded",
        default=None,
        metavar="MAX_LORAS:MAX_CPU_LORAS",
        help="the settings the traffic ran with (their predicted figures are shown beside the advice)",
    )
    parser.add_argument(
        "--concurrency", type=int, default=None, help="requests running at once (default: from the trace)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(handler=run_advise)


def run_advise(args: argparse.Namespace) -> int:
    if args.trace is not None:
        trace = read_trace(args.trace)
    else:
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        request = urllib.request.Request(f"{args.url.rstrip('/')}/v1/usage/trace", headers=headers)
        with urllib.request.urlopen(request, timeout=60) as reply:
            trace = parse_trace(reply.read().decode(), args.url)
    recorded = None
    if args.recorded is not None:
        slots, sep, host = args.recorded.partition(":")
        if not sep or not slots.isdigit() or not host.isdigit():
            raise ValueError(f"--recorded takes MAX_LORAS:MAX_CPU_LORAS, e.g. 8:16; got {args.recorded!r}")
        recorded = (int(slots), int(host))
    advice = advise(trace, args.max_loras_limit, recorded, args.concurrency)
    print(advice_json(advice) if args.json else render(advice))
    return 0
