"""The window's Library view over a large library: the longest stall of the GUI thread while a
person filters, sorts and scrolls and while the metrics timer moves adapters between tiers.

    QT_QPA_PLATFORM=offscreen python -m benchmarks.library_view_probe --home DIR [--json PATH]

Opens the library under ``--home`` (``benchmarks.library_scale`` builds one) in a ``LibraryView``
(no engine), shown at 1400x900. A 5 ms QTimer measures how late the event loop runs it: the
largest lateness in a phase is its stall (paints and layouts included); the time each action
takes on the GUI thread is measured too (a refresh reads the library on a task thread: the
phase waits for it, and its showing counts as a stall). Tier ticks stand in for the metrics timer: each moves
8 GPU slots and 32 host-RAM entries to other adapters, as a busy engine does.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QApplication

from multilora_studio.adapters.registry import Registry
from multilora_studio.gui.engine_host import EngineHost
from multilora_studio.gui.library_model import COLUMNS
from multilora_studio.gui.library_view import LibraryView

PROBE_MS = 5
SLOTS, CPU_ENTRIES = 8, 32


class StallProbe:
    """A timer that records how late it fires (the event loop's latency)."""

    def __init__(self) -> None:
        self.timer = QTimer()
        self.timer.setInterval(PROBE_MS)
        self.timer.timeout.connect(self._tick)
        self.last = time.perf_counter()
        self.worst = 0.0

    def _tick(self) -> None:
        now = time.perf_counter()
        self.worst = max(self.worst, now - self.last - PROBE_MS / 1000)
        self.last = now

    def reset(self) -> None:
        self.last, self.worst = time.perf_counter(), 0.0


def tier_ticks(names: list[str], ticks: int) -> Iterator[dict[str, str]]:
    """Tier maps as the metrics timer would hand them over while slots and host RAM churn."""
    for tick in range(ticks):
        start = (tick * 97) % len(names)
        tiers = dict.fromkeys(names, "disk")
        for offset in range(CPU_ENTRIES):
            tiers[names[(start + 50 + offset) % len(names)]] = "CPU"
        for slot in range(SLOTS):
            tiers[names[(start + slot * 13) % len(names)]] = f"GPU slot {slot}"
        yield tiers


def phases(view: LibraryView) -> dict[str, list[Callable[[], object]]]:
    names = [record.name for record in view.model.records]
    bar = view.table.verticalScrollBar()
    text = "task-0123"
    ticks: list[Callable[[], object]] = [
        partial(view.model.set_tiers, tiers) for tiers in tier_ticks(names, 25)
    ]
    return {
        "refresh": [view.refresh] * 3,
        "filter (typing task-0123, then clearing)": [
            *(lambda n=n: view.filter.setText(text[:n]) for n in range(1, len(text) + 1)),
            *(lambda n=n: view.filter.setText(text[:n]) for n in range(len(text) - 1, -1, -1)),
        ],
        "sort (each column, both ways)": [
            partial(view.table.sortByColumn, column, order)
            for column in range(len(COLUMNS))
            for order in (Qt.SortOrder.DescendingOrder, Qt.SortOrder.AscendingOrder)
        ],
        "scroll (40 pages down, to the end, to the top)": [
            *(lambda page=page: bar.setValue(page * bar.pageStep()) for page in range(40)),
            view.table.scrollToBottom,
            view.table.scrollToTop,
        ],
        "metrics ticks (tiers change)": ticks,
        "metrics ticks with a filter (team0)": [lambda: view.filter.setText("team0"), *ticks],
    }


def run(home: Path) -> dict[str, dict[str, float]]:
    app = QApplication.instance() or QApplication(sys.argv[:1])
    registry = Registry(home)
    host = EngineHost(registry, demo_adapters=False)
    started = time.perf_counter()
    view = LibraryView(host)
    view.resize(1400, 900)
    view.show()
    app.processEvents()
    # The window's engine start moves the start-up heap out of the collector's generations
    # (``Engine``: gc.freeze); without it a full collection over that heap (120-135 ms here)
    # lands in whichever refresh's read sets it off.
    gc.collect()
    gc.freeze()
    results = {"open the view": {"action_ms": (time.perf_counter() - started) * 1000, "stall_ms": 0.0}}
    probe = StallProbe()
    probe.timer.start()
    for phase, actions in phases(view).items():
        probe.reset()
        longest = 0.0
        for action in actions:
            began = time.perf_counter()
            action()
            longest = max(longest, time.perf_counter() - began)
            settle = time.perf_counter() + 0.03  # let paints, the probe and a library read run
            while time.perf_counter() < settle or view.reading:
                app.processEvents()
        results[phase] = {"action_ms": longest * 1000, "stall_ms": max(probe.worst, longest) * 1000}
    probe.timer.stop()
    view.close()
    host.shutdown()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, required=True, help="the library's folder")
    parser.add_argument("--json", type=Path, default=None, help="write the results here too")
    args = parser.parse_args()
    results = run(args.home)
    for phase, numbers in results.items():
        print(
            f"{phase:48} longest action {numbers['action_ms']:8.1f} ms   stall {numbers['stall_ms']:8.1f} ms"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
