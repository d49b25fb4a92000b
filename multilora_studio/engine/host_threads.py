"""Host-side threading for an engine that drives a CUDA device.

While adapters load on the loader thread (safetensors reads, validation, packing: torch
CPU ops and Python), the worker thread must keep launching decode steps. On the H200 host
(16 cores) two defaults let the loader slow decoding down to 23-65% of its rate during a
stream of cold loads (docs/BENCHMARKS.md): torch's intra-op pool of one thread per core,
whose busy threads the loader's CPU ops wake, and Python's 5 ms GIL switch interval, which
the worker can wait out each time it needs the GIL back. Either change alone brought the
rate to 58%.
"""

from __future__ import annotations

import logging
import os
import sys

import torch

log = logging.getLogger(__name__)

CUDA_HOST_THREADS = 4
SWITCH_INTERVAL_S = 0.0005


def quiet_host_threads() -> None:
    """At most ``CUDA_HOST_THREADS`` torch CPU threads (``MULTILORA_HOST_THREADS`` overrides)
    and a GIL switch interval of at most 0.5 ms, for this process."""
    threads = int(os.environ.get("MULTILORA_HOST_THREADS", CUDA_HOST_THREADS))
    if threads > 0 and torch.get_num_threads() > threads:
        log.info("torch CPU threads %d -> %d (the device does the math)", torch.get_num_threads(), threads)
        torch.set_num_threads(threads)
    if sys.getswitchinterval() > SWITCH_INTERVAL_S:
        sys.setswitchinterval(SWITCH_INTERVAL_S)
