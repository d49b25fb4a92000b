"""A 4-bit base weight as a GPU multiplies it: gemlite's kernels for decode-sized GEMMs, the
weight dequantized into a dense buffer and cuBLAS from ``DENSE_FROM_ROWS`` rows on (prefill).

Both read one copy of the weight in the K-packed layout (``quant_weight``'s ``gptq`` kind;
AWQ weights are repacked into it at load, ``quant_pack.awq_as_gptq``): ``qweight`` [K / 8, N]
int32, which is gemlite's own packing, with the zero points unpacked to float16 [K / G, N] so
that a value is ``(q - z) * s`` as the checkpoint defines it (gemlite's ``W_group_mode`` 3).
Act-order weights gather x's columns by ``perm`` first. The kernels chosen per case were
measured side by side (``benchmarks/kernels/quant_candidates.py``, docs/BENCHMARKS.md).
"""

from __future__ import annotations

from typing import Any

import torch

from .gemlite_support import empty_layer
from .int4_dequant import dequantize_kn
from .quant_weight import QuantizedWeight, unpack_gptq_rows, unpack_sequential

__all__ = ["DENSE_FROM_ROWS", "Int4Gemm"]

DENSE_FROM_ROWS = 128  # from this many rows, dequantize + cuBLAS beats every 4-bit kernel


class Int4Gemm:
    """``x @ W^T`` over one 4-bit weight in the K-packed layout (module docstring)."""

    def __init__(self, weight: QuantizedWeight, dtype: torch.dtype, *, gemv: bool = True) -> None:
        if weight.kind != "gptq" or weight.qzeros is None:
            raise ValueError(f"Int4Gemm takes a weight in the K-packed (gptq) layout, got {weight.kind}")
        self.weight = weight
        self.dtype = dtype
        self.zeros = (unpack_sequential(weight.qzeros) + weight.zero_offset).half()  # [K / G, N]
        self.scales = weight.scales.half()  # [K / G, N]
        self.layer: Any = self._gemlite_layer() if gemv else None

    def _gemlite_layer(self) -> Any:
        """gemlite's A16W4 module over this weight, its packed words shared with ``weight``."""
        weight = self.weight
        layer = empty_layer(weight.device, self.dtype, 4, weight.group_size, weight.shape)
        values = unpack_gptq_rows(self.weight.qweight).to(torch.uint8).t().contiguous()  # [N, K]
        layer.pack(values, self.scales.t(), self.zeros.t(), fma_mode=False)  # its meta [N, K / G]
        if not torch.equal(layer.W_q, self.weight.qweight):
            raise RuntimeError("gemlite packed the 4-bit weight in another layout than GPTQ's")
        layer.W_q.data = self.weight.qweight  # one copy of the packed words
        return layer

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, K] -> [T, N] in x's dtype: ``x @ dequantize(weight).T + bias``."""
        if self.weight.perm is not None:
            x = x.index_select(1, self.weight.perm)  # stored row j multiplies input feature perm[j]
        small = self.layer is not None and x.shape[0] < DENSE_FROM_ROWS
        y = self.packed_product(x) if small else self.dense_product(x)
        return y if bias is None else y + bias

    def packed_product(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, K] (in stored row order) @ W^T by gemlite's kernel on the packed weight -> [T, N]."""
        return self.layer(x)

    def dense_product(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, K] (in stored row order) @ W^T over the weight dequantized first -> [T, N]."""
        k, n = self.weight.in_features, self.weight.out_features
        dense = dequantize_kn(
            self.weight.qweight, self.zeros, self.scales, self.weight.group_size,
            torch.empty(k, n, dtype=x.dtype, device=x.device),
        )  # fmt: skip
        return x @ dense
