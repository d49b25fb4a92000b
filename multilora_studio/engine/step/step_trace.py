"""A ring of the engine's recent steps, to see where a slow stretch of decoding went.

One record per step (a tuple append on the worker thread). ``summarize`` splits a window
of records by step kind: decode steps replayed from a CUDA graph, and eager steps (those
with prompt tokens, or without a graph), with their host phases and the idle gaps before them.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class StepRecord:
    start: float  # time.perf_counter() when the step began (after scheduling)
    schedule_s: float  # scheduling that produced this step
    gap_s: float  # worker time between the previous step's end and this step's scheduling
    prepare_s: float
    launch_s: float
    sample_s: float  # on CUDA: waits for the device to finish the step
    post_s: float
    tokens: int
    sequences: int
    prompt_tokens: int  # tokens of chunks longer than one (prefill)
    lora_sequences: int
    graph: bool  # replayed from a captured decode graph
    uploads_in_flight: int

    @property
    def total_s(self) -> float:
        return self.prepare_s + self.launch_s + self.sample_s + self.post_s


class StepTrace:
    """The last ``capacity`` steps; ``snapshot`` is safe from any thread."""

    def __init__(self, capacity: int = 16384) -> None:
        self._records: deque[StepRecord] = deque(maxlen=capacity)
        self._lock = threading.Lock()

    def record(self, record: StepRecord) -> None:
        with self._lock:
            self._records.append(record)

    def snapshot(self, since: float = 0.0, until: float = float("inf")) -> list[StepRecord]:
        with self._lock:
            return [r for r in self._records if since <= r.start <= until]


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"count": 0}
    arr = np.asarray(values) * 1e3
    return {
        "count": len(values),
        "sum_ms": float(arr.sum()),
        "mean_ms": float(arr.mean()),
        "p50_ms": float(np.percentile(arr, 50)),
        "p90_ms": float(np.percentile(arr, 90)),
        "max_ms": float(arr.max()),
    }


def summarize(records: list[StepRecord]) -> dict[str, object]:
    """Counts and step-time percentiles per kind, and where the wall time of the window went."""
    if not records:
        return {"steps": 0}
    graph = [r for r in records if r.graph]
    eager = [r for r in records if not r.graph]
    last = records[-1]
    wall = last.start + last.total_s - records[0].start
    return {
        "steps": len(records),
        "wall_s": wall,
        "graph_steps": _stats([r.total_s for r in graph]),
        "graph_host": _stats([r.prepare_s + r.launch_s for r in graph]),
        "eager_steps": _stats([r.total_s for r in eager]),
        "eager_prompt_tokens": sum(r.prompt_tokens for r in eager),
        "eager_host": _stats([r.prepare_s + r.launch_s for r in eager]),
        "schedule": _stats([r.schedule_s for r in records]),
        "gaps": _stats([r.gap_s for r in records[1:]]),  # the first one reaches back before the window
        "mean_sequences": float(np.mean([r.sequences for r in records])),
        "mean_lora_sequences": float(np.mean([r.lora_sequences for r in records])),
        "steps_with_uploads": sum(r.uploads_in_flight > 0 for r in records),
    }


def records_as_dicts(records: list[StepRecord]) -> list[dict[str, object]]:
    return [asdict(r) for r in records]
