"""A library of 10,000 adapters: the library's reads, `adapters list`, an engine and endpoint
started over it (with the adapter files it opens), /v1/models, and the window's Library view.

    python -m benchmarks.library_scale [--home DIR] [--adapters 10000] [--repeat 7] [--json PATH]

The library lives under ``--home`` (``MULTILORA_STUDIO_HOME``; built once by
``benchmarks.library_farm`` with the embedded model, reused by later runs). Each timing is the
median (and the largest) of ``--repeat`` runs. The engine runs on the CPU with the embedded
model; the endpoint on loopback. An audit hook counts the adapter files Python opens while the
library is added to the engine; the engine's host tier shows whether any weights were read.
``benchmarks.library_view_probe`` measures the Library view and ``benchmarks.library_window_start``
the window's engine start, each in a process of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from multilora_studio.demo import SKIP_ENV
from multilora_studio.paths import HOME_ENV


def timed(action: Callable[[], object], repeat: int) -> dict[str, float]:
    """Median and largest wall time of ``repeat`` runs, in ms."""
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        action()
        times.append((time.perf_counter() - began) * 1000)
    return {"median_ms": statistics.median(times), "max_ms": max(times)}


def library_reads(repeat: int) -> dict[str, dict[str, float]]:
    from multilora_studio.adapters.registry import Registry
    from multilora_studio.cli import main

    registry = Registry()
    records = registry.list_adapters()
    digest = records[0].base_digest

    def listing(*flags: str) -> Callable[[], object]:
        return lambda: main(["adapters", "list", "--no-demo-adapters", *flags])

    with contextlib.redirect_stdout(io.StringIO()):
        return {
            "open the library": timed(Registry, repeat),
            "list every adapter": timed(registry.list_adapters, repeat),
            "get by name": timed(lambda: registry.get("team05/task-09005"), repeat),
            "get by alias": timed(lambda: registry.get("t09003"), repeat),
            "adapters of one base (by digest)": timed(
                lambda: [r for r in registry.list_adapters() if r.base_digest == digest], repeat
            ),
            "an adapter's history": timed(lambda: registry.events("team05/task-09005"), repeat),
            "names free for an import": timed(lambda: registry.check_names("new-one", ["new-alias"]), repeat),
            "adapters list (in process)": timed(listing(), repeat),
            "adapters list --json (in process)": timed(listing("--json"), repeat),
        }


def command_line(repeat: int, empty_home: Path) -> dict[str, dict[str, float]]:
    """`adapters list` as a command, and the same on an empty library (the interpreter and imports)."""
    command = [sys.executable, "-m", "multilora_studio", "adapters", "list", "--no-demo-adapters"]

    def run(home: str | None = None) -> Callable[[], object]:
        env = dict(os.environ) if home is None else {**os.environ, HOME_ENV: home}
        return lambda: subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)

    return {
        "multilora-studio adapters list (process)": timed(run(), repeat),
        "the same on an empty library": timed(run(str(empty_home)), repeat),
    }


def engine_and_endpoint(repeat: int) -> dict[str, object]:
    """Start an engine, add the library to it as `serve` does, serve it, GET /v1/models."""
    opened: Counter[str] = Counter()

    def count_opens(event: str, args: tuple) -> None:
        if event == "open" and isinstance(args[0], str | Path) and "/adapters/" in str(args[0]):
            opened[Path(args[0]).name] += 1

    from multilora_studio.cli.serve import serve_library
    from multilora_studio.deploy import BasePool
    from multilora_studio.engine import Engine, EngineConfig
    from multilora_studio.server import ApiServer, ServerConfig

    began = time.perf_counter()
    engine = Engine(EngineConfig(device="cpu"))
    engine_s = time.perf_counter() - began
    pool = BasePool([engine.config], started=[engine])
    sys.addaudithook(count_opens)  # stays for the process; only the library reads open adapter files
    began = time.perf_counter()
    served = serve_library(pool, demo_adapters=False)
    library_s = time.perf_counter() - began
    files = dict(opened)
    metrics = engine.metrics(fresh=True)
    server = ApiServer(pool, ServerConfig(port=0))
    began = time.perf_counter()
    url = server.start()
    listen_s = time.perf_counter() - began

    def get(path: str) -> Callable[[], object]:
        return lambda: json.load(urllib.request.urlopen(f"{url}{path}", timeout=60))

    cards = len(get("/v1/models")()["data"])  # type: ignore[index]
    result = {
        "engine start (embedded model, CPU)": {"s": engine_s},
        "library added to the engine (serve_library)": {"s": library_s, "adapters served": len(served)},
        "adapter files opened while adding it": files,
        "adapters in host RAM after start": len(metrics.cpu_adapters) if metrics is not None else None,
        "endpoint listening": {"s": listen_s},
        "GET /v1/models": {**timed(get("/v1/models"), repeat), "models": cards},
        "GET /v1/models/{adapter}": timed(get("/v1/models/team05/task-09005"), repeat),
    }
    server.stop()
    engine.shutdown()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, default=Path("/tmp/multilora-library-scale"))
    parser.add_argument("--adapters", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--skip", nargs="*", default=[], choices=("engine", "gui"), help="parts left out")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    os.environ[HOME_ENV] = str(args.home / "home")
    os.environ[SKIP_ENV] = "1"

    from benchmarks.library_farm import build_library
    from multilora_studio.adapters.registry import Registry
    from multilora_studio.cli.shared import describe_base
    from multilora_studio.engine.model.model_source import describe_model
    from multilora_studio.engine.model.model_spec import load_spec

    began = time.perf_counter()
    spec = load_spec(describe_model(None).folder)
    added = build_library(Registry(), describe_base(None), spec, args.adapters, args.home / "work")
    results: dict[str, object] = {"library": {"adapters added now": added, "s": time.perf_counter() - began}}
    results["library reads"] = library_reads(args.repeat)
    results["command line"] = command_line(args.repeat, args.home / "empty")
    if "engine" not in args.skip:
        results["engine and endpoint"] = engine_and_endpoint(args.repeat)
    if "gui" not in args.skip:
        for part, module in (
            ("library view", "library_view_probe"),
            ("window start", "library_window_start"),
        ):
            report = args.home / f"{module}.json"
            subprocess.run(
                [sys.executable, "-m", f"benchmarks.{module}", "--home", os.environ[HOME_ENV],
                 "--json", str(report)],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            results[part] = json.loads(report.read_text())
    text = json.dumps(results, indent=1)
    print(text)
    if args.json is not None:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
