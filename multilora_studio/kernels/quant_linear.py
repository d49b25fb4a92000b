"""The base GEMM of a projection whose weight may be quantized, run as a :class:`QuantPlan` says.

The plan is decided once per engine (``engine/step/quant_plan_builder.py``, from the checkpoint's
format, ``EngineConfig`` and the device) and read by the model through ``quant_linear``:

* ``dequantize_at_load``: the loader turns every quantized weight into a dense one of the
  model's dtype (the CPU: the dense GEMMs, oneDNN-packed, are the fastest there, and a step
  reads float weights as before); the model then never sees a ``QuantizedWeight``.
* ``fp8``: ``"scaled_mm"`` (CUDA compute capability >= 8.9, bf16 activations:
  ``torch._scaled_mm`` on FP8 tensor cores, activations quantized per token on the fly),
  ``"triton"`` (the dequantize-GEMM, ``kernels/dequant_gemm.py``: weights read at 8 bits,
  activations kept in their dtype), or ``"dequantize"`` (a dense copy per call, any device).
* ``int4``: ``"triton"`` (the dequantize-GEMM) or ``"dequantize"``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .dequant_gemm import dequant_gemm
from .quant_weight import QuantizedWeight, Weight, dequantize

__all__ = [
    "FP8_PATHS",
    "INT4_PATHS",
    "QuantPlan",
    "fp8_scaled_mm",
    "quant_linear",
    "quantize_rows_fp8",
    "scaled_mm_supported",
]

FP8_PATHS = ("scaled_mm", "triton", "dequantize")
INT4_PATHS = ("triton", "dequantize")
FP8_MAX = 448.0
SCALED_MM_CAPABILITY = (8, 9)  # Ada and Hopper and later have FP8 tensor cores


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


def scaled_mm_supported(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``torch._scaled_mm`` runs FP8 GEMMs for activations of ``dtype`` on ``device``."""
    if device.type != "cuda" or dtype != torch.bfloat16:  # row-wise scales give bf16 outputs
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.get_device_capability(index) >= SCALED_MM_CAPABILITY


def quantize_rows_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row FP8 quantization of activations: (xq [T, K] float8_e4m3fn, scales [T, 1] float32)
    with ``x ~ xq * scales`` (each row's absmax maps to 448)."""
    xf = x.float()
    scales = (xf.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp(min=1e-12)  # [T, 1]
    return (xf / scales).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scales


def fp8_scaled_mm(x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` [T, K] (bf16) times an FP8 weight [N, K] on FP8 tensor cores -> [T, N].

    Semantics::

        xq, sx = quantize_rows_fp8(x)                                # [T, K] e4m3, [T, 1]
        y = ((xq.double() * sx) @ dequantize(weight, float64).T + bias).to(x.dtype)

    The activations lose precision here (e4m3 per token), unlike the dequantize paths.
    """
    if weight.kind != "fp8":
        raise ValueError(f"fp8_scaled_mm takes an fp8 weight, got {weight.kind}")
    if x.dim() != 2 or x.shape[1] != weight.in_features or x.dtype != torch.bfloat16:
        raise ValueError(f"x must be [T, {weight.in_features}] bf16, got {tuple(x.shape)} {x.dtype}")
    xq, sx = quantize_rows_fp8(x)
    return torch._scaled_mm(
        xq,
        weight.qweight.t(),  # [K, N] column-major, as cuBLAS takes the second operand
        scale_a=sx,
        scale_b=weight.scales.view(1, -1),
        bias=None if bias is None else bias.to(x.dtype),
        out_dtype=x.dtype,
    )


def quant_linear(
    x: torch.Tensor, weight: Weight, bias: torch.Tensor | None = None, *, plan: QuantPlan
) -> torch.Tensor:
    """``F.linear(x, W, bias)`` [T, N] for a dense or a quantized weight, on the plan's path.

    Semantics: ``x @ dequantize(weight).T + bias`` (``kernels/quant_weight.py``).
    """
    if isinstance(weight, torch.Tensor):
        return F.linear(x, weight, bias)
    path = plan.path_of(weight)
    if path == "scaled_mm" and weight.out_features % 16 == 0 and weight.in_features % 16 == 0:
        return fp8_scaled_mm(x, weight, bias)
    if path in ("triton", "scaled_mm"):  # scaled_mm needs dimensions in multiples of 16
        return dequant_gemm(x, weight, bias)
    return F.linear(x, dequantize(weight, x.dtype), bias)
