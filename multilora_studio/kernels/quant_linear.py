"""The base GEMM of a projection whose weight may be quantized, run as a :class:`QuantPlan` says.

The plan is decided once per engine (``engine/step/quant_plan_builder.py``, from the checkpoint's
format, ``EngineConfig`` and the device); ``prepare_quantized`` attaches each weight's kernels
at load, and the model multiplies through ``quant_linear``:

* ``dequantize_at_load``: the loader turns every quantized weight into a dense one of the
  model's dtype (the CPU: the dense GEMMs, oneDNN-packed, are the fastest there, and a step
  reads float weights as before); the model then never sees a ``QuantizedWeight``.
* ``int4``: ``"gemlite"`` (``Int4Gemm``: gemlite's kernels for decode-sized GEMMs, the weight
  dequantized + cuBLAS for prefill), ``"cublas"`` (dequantized + cuBLAS at every size: gemlite
  missing, or batch-invariant mode, where gemlite's split-K atomics would make sums depend on
  timing), or ``"dequantize"`` (a float64-exact dense copy per call, any device: tests).
* ``fp8``: ``"gemlite"`` (``Fp8Gemm``: gemlite's weight-only GEMV for decode-sized GEMMs,
  cuBLAS for more rows: FP8 tensor cores where the GPU has them, else the weight dequantized),
  ``"cublas"`` (cuBLAS at every size), or ``"dequantize"``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .fp8_gemm import Fp8Gemm
from .fp8_scaled_mm import scaled_mm_supported
from .int4_gemm import Int4Gemm
from .quant_weight import QuantizedWeight, Weight, dequantize

__all__ = ["FP8_PATHS", "INT4_PATHS", "QuantPlan", "prepare_quantized", "quant_linear"]

FP8_PATHS = ("gemlite", "cublas", "dequantize")
INT4_PATHS = ("gemlite", "cublas", "dequantize")
GEMV_DTYPES = (torch.bfloat16, torch.float16)  # gemlite's activations (float32 models: cuBLAS)


@dataclass(frozen=True)
class QuantPlan:
    """How quantized base weights are multiplied (module docstring); validated."""

    dequantize_at_load: bool = True
    fp8: str = "dequantize"
    int4: str = "dequantize"

    def __post_init__(self) -> None:
        if not isinstance(self.dequantize_at_load, bool):
            raise ValueError(f"dequantize_at_load must be True or False, got {self.dequantize_at_load!r}")
        if self.fp8 not in FP8_PATHS:
            raise ValueError(f"fp8 must be one of {FP8_PATHS}, got {self.fp8!r}")
        if self.int4 not in INT4_PATHS:
            raise ValueError(f"int4 must be one of {INT4_PATHS}, got {self.int4!r}")

    def path_of(self, weight: QuantizedWeight) -> str:
        """The path a weight of this kind takes."""
        return self.fp8 if weight.kind == "fp8" else self.int4


def prepare_quantized(weight: QuantizedWeight, plan: QuantPlan, dtype: torch.dtype) -> QuantizedWeight:
    """``weight`` (on its device; 4-bit ones in the K-packed layout unless the plan dequantizes)
    with the kernels its plan's path multiplies it with attached as ``weight.gemm``."""
    path = plan.path_of(weight)
    if path == "dequantize":
        return weight
    gemv = path == "gemlite" and dtype in GEMV_DTYPES
    if weight.kind == "fp8":
        weight.gemm = Fp8Gemm(
            weight, dtype, gemv=gemv, tensor_cores=scaled_mm_supported(weight.device, dtype)
        )
    else:
        weight.gemm = Int4Gemm(weight, dtype, gemv=gemv)
    return weight


def quant_linear(
    x: torch.Tensor, weight: Weight, bias: torch.Tensor | None = None, *, plan: QuantPlan
) -> torch.Tensor:
    """``F.linear(x, W, bias)`` [T, N] for a dense or a quantized weight, on the plan's path.

    Semantics: ``x @ dequantize(weight).T + bias`` (``kernels/quant_weight.py``).
    """
    if isinstance(weight, torch.Tensor):
        return F.linear(x, weight, bias)
    if weight.gemm is not None:
        return weight.gemm(x, bias)
    return F.linear(x, dequantize(weight, x.dtype), bias)
