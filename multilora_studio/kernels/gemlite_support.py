"""gemlite (Triton low-bit GEMV / GEMM kernels, the optional extra ``cuda``), imported only on a
CUDA device and set up once: its launch table
for the GPU loaded (no autotuning at start-up where the table has the shape) and float32
accumulation of split-K partials (bfloat16 atomics lose 3-6 % of a GEMV's precision).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

__all__ = ["GEMLITE_MISSING", "empty_layer", "gemlite", "gemlite_available", "launch_table"]

GEMLITE_MISSING = "the 4-bit and FP8 GEMV kernels need gemlite (the package's extra cuda)"
# gemlite's launch tables (its configs/ folder) by a word of the device's name; H200 and H800
# share the H100's SMs and take its table
TABLES = {
    "h100": "h100", "h200": "h100", "h800": "h100", "a100": "a100", "l40s": "l40s", "l40": "l40",
    "l4": "l4", "a6000": "a6000", "a40": "a40", "4090": "4090", "5090": "5090", "6000 ada": "6000_ada",
}  # fmt: skip


def gemlite_available() -> bool:
    """Whether gemlite is installed (it is not imported here: its import needs a CUDA device)."""
    from importlib.util import find_spec

    return find_spec("gemlite") is not None


def launch_table(device_name: str) -> str | None:
    """The name of gemlite's launch table for a device (None: gemlite autotunes each shape)."""
    name = device_name.lower()
    for word, table in TABLES.items():
        if word in name:
            return table
    return None


@cache
def gemlite(device_index: int) -> ModuleType:
    """gemlite, set up for CUDA device ``device_index`` (ImportError naming the extra when missing)."""
    try:
        import gemlite as module
        from gemlite.core import set_native_atomic_bfp16
    except ImportError as missing:
        raise ImportError(GEMLITE_MISSING) from missing
    set_native_atomic_bfp16(False)
    table = launch_table(torch.cuda.get_device_name(device_index))
    if table is not None:
        module.load_config(str(Path(module.__file__).parent / "configs" / f"{table}.json"))
    return module


def empty_layer(
    device: torch.device, dtype: torch.dtype, bits: int, group_size: int, shape: tuple[int, int]
) -> Any:
    """gemlite's module for a [N, K] weight of ``bits`` in groups of ``group_size`` inputs, with
    activations and outputs in ``dtype`` (bf16 or fp16), before its ``pack``."""
    module = gemlite(device.index or 0)
    from gemlite.dtypes import DType

    n, k = shape
    kind = DType.BF16 if dtype == torch.bfloat16 else DType.FP16
    return module.GemLiteLinearTriton(
        bits, group_size=group_size, in_features=k, out_features=n, input_dtype=kind, output_dtype=kind
    )
