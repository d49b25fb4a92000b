"""FP8 GEMMs on FP8 tensor cores: ``torch._scaled_mm`` with activations quantized per token and
the weight's per-channel scales (compute capability >= 8.9, bf16 activations)."""

from __future__ import annotations

import torch

from .quant_weight import QuantizedWeight

__all__ = ["FP8_MAX", "fp8_scaled_mm", "quantize_rows_fp8", "scaled_mm_supported"]

FP8_MAX = 448.0
SCALED_MM_CAPABILITY = (8, 9)  # Ada and Hopper and later have FP8 tensor cores


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
