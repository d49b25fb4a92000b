"""Sample every Python thread's stack every few milliseconds, to explain a slow stretch.

A diagnostic for benchmarks: ``during(start, end)`` counts, per thread, the stacks seen in
a time window (say, a step the engine's step trace shows as slow), and ``stalls`` lists the
windows where the sampler itself did not run on time (another thread held the GIL).
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter

from multilora_studio.engine.step.step_trace import StepRecord, records_as_dicts


def _stack(frame, depth: int) -> str:
    parts: list[str] = []
    while frame is not None and len(parts) < depth:
        code = frame.f_code
        parts.append(f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}:{frame.f_lineno}")
        frame = frame.f_back
    return " < ".join(parts)


class StackSampler(threading.Thread):
    def __init__(self, interval_s: float = 0.002, depth: int = 5) -> None:
        super().__init__(name="stack-sampler", daemon=True)
        self.interval_s = interval_s
        self.depth = depth
        self.samples: list[tuple[float, str, str]] = []  # (perf_counter, thread name, stack)
        self.ticks: list[float] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            now = time.perf_counter()
            self.ticks.append(now)
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident != self.ident:
                    self.samples.append((now, names.get(ident, str(ident)), _stack(frame, self.depth)))
            time.sleep(self.interval_s)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()

    def during(self, start: float, end: float, top: int = 3) -> dict[str, list[tuple[str, int]]]:
        """Per thread, its most frequent stacks among the samples taken in [start, end]."""
        counts: dict[str, Counter[str]] = {}
        for t, name, stack in self.samples:
            if start <= t <= end:
                counts.setdefault(name, Counter())[stack] += 1
        return {name: c.most_common(top) for name, c in counts.items()}

    def stalls(self, longer_than_s: float = 0.015) -> list[tuple[float, float]]:
        """(start, seconds) of the gaps between samples longer than ``longer_than_s``."""
        return [(a, b - a) for a, b in zip(self.ticks, self.ticks[1:], strict=False) if b - a > longer_than_s]


def explain_slow_steps(records: list[StepRecord], sampler: StackSampler, count: int = 4) -> list[dict]:
    """The slowest steps (and schedulings) of a window with the thread stacks sampled meanwhile."""
    explained = []
    by_total = sorted(records, key=lambda r: r.total_s, reverse=True)[:count]
    by_schedule = sorted(records, key=lambda r: r.schedule_s, reverse=True)[:count]
    for kind, picked in (("step", by_total), ("schedule", by_schedule)):
        for r in picked:
            start = r.start - r.schedule_s if kind == "schedule" else r.start
            end = r.start if kind == "schedule" else r.start + r.total_s
            stacks = sampler.during(start, end)
            ms = round((end - start) * 1e3, 2)
            explained.append({"kind": kind, "ms": ms, "record": records_as_dicts([r])[0], "stacks": stacks})
            print(f"slow {kind} {ms} ms: graph={r.graph} tokens={r.tokens} seqs={r.sequences}")
            for thread, thread_stacks in stacks.items():
                for stack, hits in thread_stacks:
                    print(f"    {thread:<24} {hits:>3}  {stack}")
    stalls = [(round(start, 3), round(seconds * 1e3, 1)) for start, seconds in sampler.stalls()[:10]]
    print(f"sampler stalls (> 15 ms without a sample): {stalls}")
    return explained
