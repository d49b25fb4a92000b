"""The share of the cores each test process's thread pools get."""

from __future__ import annotations

import os

THREAD_POOLS = ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS")  # OpenMP's (torch's) and Numba's


def worker_thread_pools() -> dict[str, str]:
    """In a pytest-xdist worker, the thread-pool sizes not set yet: the usable cores divided
    among the workers (at least one each). Nothing in the controller or a run without workers,
    whose processes keep every core (and whose environment the workers would inherit). The cores
    are counted as ``engine.config.usable_cores`` counts them; that module imports torch, which
    must not load before these are set."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers is None or "PYTEST_XDIST_WORKER" not in os.environ:
        return {}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    share = str(max(1, cores // int(workers)))
    return {name: share for name in THREAD_POOLS if name not in os.environ}
