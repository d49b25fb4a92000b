"""An FP8 base weight as a GPU multiplies it: gemlite's weight-only GEMV (e4m3 read, converted
to the activations' dtype in registers) for decode-sized GEMMs, ``torch._scaled_mm`` on FP8
tensor cores (activations quantized per token) from ``TENSOR_CORES_FROM_ROWS`` rows on, or the
weight dequantized to the activations' dtype and cuBLAS on a GPU without FP8 tensor cores.

They read the one stored copy: ``qweight`` [N, K] float8_e4m3fn with float32 ``scales`` [N]
(gemlite takes its transpose as a view and applies the scales after the product). The
kernels chosen per case were measured side by side (``benchmarks/kernels/quant_candidates.py``).
"""

from __future__ import annotations

from typing import Any

import torch

from .fp8_scaled_mm import fp8_scaled_mm
from .gemlite_support import empty_layer
from .quant_weight import QuantizedWeight

__all__ = ["TENSOR_CORES_FROM_ROWS", "Fp8Gemm"]

TENSOR_CORES_FROM_ROWS = 16  # from this many rows FP8 tensor cores beat the weight-only GEMV


class Fp8Gemm:
    """``x @ W^T`` over one FP8 weight (module docstring)."""

    def __init__(
        self, weight: QuantizedWeight, dtype: torch.dtype, *, gemv: bool = True, tensor_cores: bool = True
    ) -> None:
        if weight.kind != "fp8":
            raise ValueError(f"Fp8Gemm takes an fp8 weight, got {weight.kind}")
        self.weight = weight
        self.dtype = dtype
        self.tensor_cores = tensor_cores
        self.layer: Any = self._gemlite_layer() if gemv else None

    def _gemlite_layer(self) -> Any:
        """gemlite's A16W8 module over this weight's bytes (a view, no copy)."""
        n, k = self.weight.shape
        layer = empty_layer(self.weight.device, self.dtype, 8, k, self.weight.shape)
        # per-channel scales: gemlite applies them after the product
        layer.pack(self.weight.qweight, self.weight.scales.view(n, 1), zeros=None)
        return layer

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, K] -> [T, N] in x's dtype: ``x @ dequantize(weight).T + bias`` (on FP8 tensor
        cores the activations are rounded to e4m3 per token first, ``fp8_scaled_mm``)."""
        if self.layer is not None and x.shape[0] < TENSOR_CORES_FROM_ROWS:
            y = self.packed_product(x)
        elif self.tensor_cores:
            return fp8_scaled_mm(x, self.weight, bias)
        else:
            y = self.dense_product(x)
        return y if bias is None else y + bias

    def packed_product(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, K] @ W^T by gemlite's weight-only GEMV -> [T, N]."""
        return self.layer(x)

    def dense_product(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, K] @ W^T over the weight dequantized to x's dtype first (float32 products) -> [T, N]."""
        dense = (self.weight.qweight.float() * self.weight.scales.unsqueeze(1)).to(x.dtype)  # [N, K]
        return x @ dense.t()
