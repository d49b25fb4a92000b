"""What the installed Triton and the device offer the kernels: the interpreter and
programmatic dependent launch (PDL).

``TRITON_INTERPRET`` is read here and nowhere else in the kernels. With
``TRITON_INTERPRET=1`` Triton runs kernels on the CPU (the test suite); Triton itself reads
the variable when a kernel is defined, so it is set before triton is imported and read once.
"""

from __future__ import annotations

import os
from functools import cache

import torch
import triton

try:  # Triton >= 3.4 (programmatic dependent launch); no-op fallbacks otherwise
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    HAVE_GDC = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    HAVE_GDC = False

    @triton.jit
    def gdc_wait():  # type: ignore[no-redef,unused-ignore]
        pass

    @triton.jit
    def gdc_launch_dependents():  # type: ignore[no-redef,unused-ignore]
        pass


__all__ = [
    "HAVE_GDC",
    "gdc_launch_dependents",
    "gdc_wait",
    "interpreting",
    "launch_options",
    "pdl_supported",
    "triton_runs_on",
]


@cache
def interpreting() -> bool:
    """Whether Triton kernels run under Triton's CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_runs_on(device: torch.device) -> bool:
    """Whether Triton kernels can run on tensors of ``device``: CUDA, or the CPU under the interpreter."""
    return device.type == "cuda" or interpreting()


@cache
def _capability_major(device_index: int) -> int:
    return torch.cuda.get_device_capability(device_index)[0]


def pdl_supported(device: torch.device) -> bool:
    """Whether kernels on ``device`` can use programmatic dependent launch: CUDA compute
    capability 9.0+, a Triton that has ``gdc_wait``, and not the interpreter."""
    if device.type != "cuda" or not HAVE_GDC or interpreting():
        return False
    return _capability_major(device.index if device.index is not None else torch.cuda.current_device()) >= 9


def launch_options(pdl: bool, num_warps: int) -> dict[str, object]:
    """Launch keyword arguments of the kernels that take a ``USE_PDL`` constexpr."""
    options: dict[str, object] = {"num_warps": num_warps, "USE_PDL": pdl}
    if pdl:
        options["launch_pdl"] = True
    return options
