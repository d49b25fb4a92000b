"""The share of the cores each test process's thread pools get."""

from __future__ import annotations

import os


def worker_threads() -> str:
    """Usable cores divided among the pytest-xdist workers (at least one), as an environment value."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return str(max(1, cores // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))
