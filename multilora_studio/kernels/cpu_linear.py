"""Dense GEMMs on the CPU through oneDNN, each weight reordered once into oneDNN's blocked layout.

``F.linear`` on the CPU reads a row-major weight with a generic GEMM; at decode sizes
(1..8 rows) it streams weights at about 13 GB/s on a 2-core Zen 4 whose memory reads
35 GB/s. The same weight reordered once by oneDNN streams at about 22 GB/s at 1 and at 8
rows (see docs/dev/kernels.md). A reordered weight keeps its shape and dtype but not its
layout: only ``packed_linear`` may read it.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


def _ops_present() -> bool:
    mkldnn = getattr(torch.ops, "mkldnn", None)
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(mkldnn, "_reorder_linear_weight")
        and hasattr(mkldnn, "_linear_pointwise")
    )


@functools.cache
def onednn_packing_available(dtype: torch.dtype) -> bool:
    """True when this torch build packs and multiplies ``dtype`` weights through oneDNN correctly."""
    if dtype not in (torch.float32, torch.bfloat16) or not _ops_present():
        return False
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 40, generator=generator).to(dtype)
    x = torch.randn(3, 40, generator=generator).to(dtype)
    try:
        y = packed_linear(x, pack_weight(weight))
    except RuntimeError:
        return False
    expected = F.linear(x.float(), weight.float())
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    return bool(torch.allclose(y.float(), expected, atol=tolerance * 10, rtol=tolerance))


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] row-major weight -> the same [N, K] in oneDNN's blocked layout (a new tensor)."""
    if weight.dim() != 2 or weight.device.type != "cpu":
        raise ValueError(f"pack_weight takes a 2-D CPU weight, got {tuple(weight.shape)} on {weight.device}")
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), None)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` over a weight from ``pack_weight``: x [T, K] -> [T, N].

    Semantics: ``x @ weight.T + bias`` for the row-major ``weight`` that was packed.
    """
    if x.shape[-1] != packed.shape[1]:
        raise ValueError(f"input has {x.shape[-1]} features, the packed weight takes {packed.shape[1]}")
    if x.dtype != packed.dtype:
        raise ValueError(f"input dtype {x.dtype} differs from the packed weight's {packed.dtype}")
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
