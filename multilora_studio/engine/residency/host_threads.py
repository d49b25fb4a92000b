"""Host-side threading: torch's CPU threads for the steps, and the GIL beside a busy loader.

The worker thread's torch threads are sized once (``EngineConfig.cpu_threads_for``): on the
CPU one less than the usable cores, since OpenMP workers spinning at each barrier collapse
when another process takes a core (docs/BENCHMARKS.md, "CPU threads").

While adapters load on the loader thread (safetensors reads, validation, packing: torch
CPU ops and Python), the worker thread must keep launching decode steps, and it needs the
GIL between launches. With Python's default 5 ms switch interval the worker can wait that
long each time the loader holds the GIL; the engine lowers it to 0.5 ms. On the H200 host
(16 cores) decode during a stream of cold loads ran at 23-65% of its rate with the default
and at 58-71% with 0.5 ms (docs/BENCHMARKS.md; the runs vary a lot between machines).

Capping torch's CPU threads beside a CUDA device was measured too and dropped: 4 threads gave
57-58% during cold loads and cost 3-7% of base decode throughput.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

SWITCH_INTERVAL_S = 0.0005


def quiet_host_threads() -> None:
    """A GIL switch interval of at most 0.5 ms for this process."""
    if sys.getswitchinterval() > SWITCH_INTERVAL_S:
        sys.setswitchinterval(SWITCH_INTERVAL_S)


def size_step_threads(threads: int | None) -> None:
    """torch's CPU threads for the calling (worker) thread's steps; None leaves torch's count.

    OpenMP keeps the count per thread, so the worker's count does not change the loader's,
    and a thread started later begins with the last count set.
    """
    if threads is not None:
        torch.set_num_threads(threads)


LOADER_TORCH_THREADS = {"cpu": 1, "cuda": 2}
_cap_lock = threading.Lock()
_cap_state = {"loads": 0, "saved": 0}  # loads under the cap now; torch's count before the first


@contextmanager
def loader_threads(device_type: str) -> Iterator[None]:
    """Cap torch's CPU threads while the calling (loader) thread loads an adapter.

    Without the cap each loader thread ran its copies and checks on every core, and its
    OpenMP workers spinning after each operation took the cores the worker needs to keep
    decoding. OpenMP keeps the count per thread, so threads already running torch keep
    theirs; torch also uses the last count set as the default of threads that have not run
    a parallel operation yet, so the count from before the first of overlapping loads is
    set back when the last of them ends.
    """
    with _cap_lock:
        if _cap_state["loads"] == 0:
            _cap_state["saved"] = torch.get_num_threads()
        _cap_state["loads"] += 1
    torch.set_num_threads(LOADER_TORCH_THREADS.get(device_type, 2))
    try:
        yield
    finally:
        with _cap_lock:
            _cap_state["loads"] -= 1
            if _cap_state["loads"] == 0:
                torch.set_num_threads(_cap_state["saved"])
