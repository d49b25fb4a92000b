"""What the benchmarks share: the common flags, alternating rounds with the ratio of medians,
decode throughput from request outputs, random prompts, and the results printed and written."""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from multilora_studio.engine import RequestOutput


def parser(doc: str | None) -> argparse.ArgumentParser:
    """An argument parser with ``--rounds`` (alternations) and ``--json`` (result file)."""
    built = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    built.add_argument("--rounds", type=int, default=3, help="alternating rounds of each variant")
    built.add_argument("--json", type=Path, default=None, help="write the results here")
    return built


def alternate(rounds: int, without: Callable[[], float], with_: Callable[[], float]) -> dict[str, Any]:
    """Run the two variants in turn ``rounds`` times: their medians, the ratio with/without and each round."""
    plain, changed = [], []
    for _ in range(rounds):
        plain.append(without())
        changed.append(with_())
    a, b = statistics.median(plain), statistics.median(changed)
    return {"without": a, "with": b, "ratio": b / a, "rounds_without": plain, "rounds_with": changed}


def summary(label: str, result: dict[str, Any], unit: str = "tok/s") -> str:
    """One line: both medians, their ratio and the ratio of each round."""
    each = [round(b / a, 3) for a, b in zip(result["rounds_without"], result["rounds_with"], strict=True)]
    return (
        f"{label:16s} without {result['without']:9.1f} {unit}  with {result['with']:9.1f} {unit}"
        f"  ratio {result['ratio']:.3f}  (rounds {each})"
    )


def decode_tok_s(outputs: Sequence[RequestOutput]) -> float:
    """Tokens per second between the last request's first token and the last finish (decode only)."""
    first = max(o.first_token_time or 0.0 for o in outputs)
    finish = max(o.finish_time or 0.0 for o in outputs)
    return sum(len(o.token_ids) - 1 for o in outputs) / (finish - first)


def random_prompts(count: int, length: int, vocab: int, generator: torch.Generator) -> list[list[int]]:
    return [torch.randint(0, vocab, (length,), generator=generator).tolist() for _ in range(count)]


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device != "cpu" else "cpu"


def write_results(path: Path | None, results: dict[str, Any]) -> None:
    if path is not None:
        path.write_text(json.dumps(results, indent=1))


def report_json(results: dict[str, Any], path: Path | None = None) -> None:
    """Print ``results`` as JSON and write them to ``path`` (when given)."""
    print(json.dumps(results, indent=1), flush=True)
    write_results(path, results)


def report_lines(results: dict[str, Any], path: Path | None, width: int) -> None:
    """Print ``results`` a ``key value`` line each (floats to three places, keys ``width`` wide) and
    write them to ``path`` (when given)."""
    for key, value in results.items():
        print(f"  {key:<{width}} {value:.3f}" if isinstance(value, float) else f"  {key:<{width}} {value}")
    write_results(path, results)


def graph_time_ms(fn: Callable[[], object], repeats: int = 20, per_graph: int = 10) -> float:
    """Device milliseconds of one ``fn()``: captured ``per_graph`` times in a CUDA graph (as the
    engine replays decode steps, so the host's launch time is not counted), replayed ``repeats``
    times."""
    fn()  # compiles before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(per_graph):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (repeats * per_graph)
