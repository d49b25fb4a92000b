"""Latency of adapter loads into a tier (disk -> host RAM, host RAM -> a GPU slot): nearest-rank
quantiles of the recent loads, overall and per adapter, in bounded memory.

Overall: the last ``LATENCY_WINDOW`` loads. Per adapter: its loads counted and the last
``ADAPTER_WINDOW`` latencies (at most ``2 * ADAPTER_WINDOW`` doubles held: under 1 KiB an
adapter and tier with its summary, measured), kept until the adapter is forgotten (removed from
the engine). Its quantiles are sorted again only after one of its loads.
"""

from __future__ import annotations

import math
import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

LATENCY_WINDOW = 1024  # the overall quantiles are of this many most recent loads
ADAPTER_WINDOW = 32  # an adapter's quantiles are of this many of its most recent loads


def nearest_rank(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of ``values`` (``q`` in [0, 1]); None when there are none."""
    return ranked(sorted(values), q) if values else None


def ranked(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of the sorted, non-empty ``ordered``."""
    rank = math.ceil(round(q * len(ordered), 9))  # round: 0.95 * 20 must be rank 19, not 20
    return ordered[min(len(ordered) - 1, max(0, rank - 1))]


@dataclass(frozen=True)
class LoadQuantiles:
    """One adapter's loads into one tier: how many, and p50 / p95 of its recent ones (seconds)."""

    loads: int
    p50_s: float | None
    p95_s: float | None


NO_LOADS = LoadQuantiles(0, None, None)


class AdapterLatencies:
    """Per-adapter load latencies (any thread): ``record`` and ``forget``; ``summary`` of one
    adapter or ``summaries`` of all; ``take_changed`` names the adapters whose figures changed,
    so that a reader redoes only theirs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds: dict[str, array[float]] = {}  # the last ADAPTER_WINDOW (or up to twice)
        self._loads: dict[str, int] = {}
        self._summaries: dict[str, LoadQuantiles] = {}
        self._stale: set[str] = set()  # recorded since their summary was made
        self._changed: set[str] = set()  # recorded or forgotten since the last take_changed

    def record(self, name: str, seconds: float) -> None:
        with self._lock:
            samples = self._seconds.setdefault(name, array("d"))
            samples.append(seconds)
            if len(samples) >= 2 * ADAPTER_WINDOW:
                del samples[:-ADAPTER_WINDOW]
            self._loads[name] = self._loads.get(name, 0) + 1
            self._stale.add(name)
            self._changed.add(name)

    def forget(self, name: str) -> None:
        """Drop ``name``'s figures (the adapter was removed)."""
        with self._lock:
            if self._seconds.pop(name, None) is not None:
                del self._loads[name]
                self._summaries.pop(name, None)
                self._stale.discard(name)
                self._changed.add(name)

    def take_changed(self) -> set[str]:
        """The adapters recorded or forgotten since the last call."""
        with self._lock:
            changed, self._changed = self._changed, set()
        return changed

    def summary(self, name: str) -> LoadQuantiles:
        """``name``'s count and quantiles (``NO_LOADS`` before its first load)."""
        with self._lock:
            return self._summary(name) if name in self._seconds else NO_LOADS

    def summaries(self) -> dict[str, LoadQuantiles]:
        """Every adapter loaded at least once: its count and quantiles."""
        with self._lock:
            return {name: self._summary(name) for name in self._seconds}

    def _summary(self, name: str) -> LoadQuantiles:
        """(Lock held.) Sorted again only after a load."""
        if name in self._stale:
            ordered = sorted(self._seconds[name][-ADAPTER_WINDOW:])
            p50, p95 = ranked(ordered, 0.5), ranked(ordered, 0.95)
            self._summaries[name] = LoadQuantiles(self._loads[name], p50, p95)
            self._stale.discard(name)
        return self._summaries[name]


@dataclass
class TierCounters:
    """Hits and misses of one tier, and the latency of its recent loads (seconds), overall and
    per adapter."""

    hits: int = 0
    misses: int = 0
    bytes_loaded: int = 0
    load_seconds: list[float] = field(default_factory=list)  # the last LATENCY_WINDOW (or up to twice)
    adapters: AdapterLatencies = field(default_factory=AdapterLatencies)

    def record(self, name: str, seconds: float) -> None:
        """One load of ``name``; the oldest beyond the window are dropped (in batches: amortised)."""
        self.load_seconds.append(seconds)
        if len(self.load_seconds) >= 2 * LATENCY_WINDOW:
            del self.load_seconds[:-LATENCY_WINDOW]
        self.adapters.record(name, seconds)

    def percentile(self, q: float) -> float | None:
        """Nearest-rank percentile of the last ``LATENCY_WINDOW`` loads; None before any load."""
        return nearest_rank(self.load_seconds[-LATENCY_WINDOW:], q)
