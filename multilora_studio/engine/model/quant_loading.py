"""Reading a base's projections as quantized weights, quantizing float ones at load, and
dequantizing them where the plan says so (``weights.load_weights`` calls these per projection).

Tensor names per format (``{p}`` = a projection's module path, e.g.
``model.layers.0.self_attn.q_proj``): FP8 ``{p}.weight`` (float8_e4m3fn [N, K]) and
``{p}.weight_scale`` ([N, 1], [N], [1] or a scalar; ``input_scale`` is not used: the
``scaled_mm`` path quantizes activations per token); AWQ ``{p}.qweight``, ``{p}.qzeros``,
``{p}.scales``; GPTQ the same plus ``{p}.g_idx``. A projection a checkpoint keeps in float
(``ignore`` / ``modules_to_not_convert``) is read as float; the parts of one fused projection
(q/k/v, gate/up) must all be quantized or all float.
"""

from __future__ import annotations

from typing import Protocol

import torch

from multilora_studio.engine.model.quant_pack import (
    awq_as_gptq,
    group_contiguous,
    quantize_awq,
    quantize_fp8,
    quantize_gptq,
)
from multilora_studio.engine.model.quantization import Quantization
from multilora_studio.kernels.quant_linear import QuantPlan, prepare_quantized
from multilora_studio.kernels.quant_weight import QuantizedWeight, Weight, concat_outputs, dequantize

QUANTIZED_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.int32, torch.int8, torch.uint8)


class TensorReader(Protocol):
    """What the loader's tensor source offers (``weights.TensorSource``)."""

    def has(self, name: str) -> bool: ...

    def raw(self, name: str) -> torch.Tensor: ...

    def is_fp8(self, name: str) -> bool: ...


def _stored_as_quantized(source: TensorReader, module: str) -> bool:
    if source.has(f"{module}.qweight"):
        return True
    weight = f"{module}.weight"
    return source.has(weight) and source.is_fp8(weight)


def _read_one(source: TensorReader, module: str, quant: Quantization) -> QuantizedWeight:
    if quant.method == "fp8":
        q = source.raw(f"{module}.weight")  # [N, K] e4m3
        if not source.has(f"{module}.weight_scale"):
            raise ValueError(f"{module}.weight is FP8 but the checkpoint lacks {module}.weight_scale")
        n, k = q.shape
        scale = source.raw(f"{module}.weight_scale").float().reshape(-1)
        if scale.numel() == 1:
            scale = scale.expand(n)  # per tensor: the same scale for every channel
        elif scale.numel() != n:
            raise ValueError(
                f"{module}.weight_scale has {scale.numel()} entries; per-channel or per-tensor scales "
                f"([{n}] or one) are served"
            )
        return QuantizedWeight("fp8", (n, k), q, scale.contiguous())
    if source.has(f"{module}.weight") and not source.has(f"{module}.qweight"):
        raise ValueError(f"{module} is FP8 in a {quant.label} checkpoint")
    qweight, qzeros, scales = (source.raw(f"{module}.{name}") for name in ("qweight", "qzeros", "scales"))
    if quant.method == "awq":  # qweight [K, N / 8]
        return QuantizedWeight("awq", (qweight.shape[1] * 8, qweight.shape[0]), qweight, scales, qzeros)
    weight = QuantizedWeight(  # gptq: qweight [K / 8, N]
        "gptq", (qweight.shape[1], qweight.shape[0] * 8), qweight, scales, qzeros,
        zero_offset=quant.zero_offset,
    )  # fmt: skip
    g_idx = f"{module}.g_idx"
    return group_contiguous(weight, source.raw(g_idx)) if source.has(g_idx) else weight


def stored_projection(source: TensorReader, modules: list[str], quant: Quantization | None) -> Weight | None:
    """The quantized weight of ``modules`` (one projection, or the parts of a fused one, their
    outputs in order) as the checkpoint stores it; None when they are stored in float."""
    stored = [_stored_as_quantized(source, module) for module in modules]
    if not any(stored):
        return None
    if quant is None or quant.at_load:
        raise ValueError(
            f"{modules[0]} is stored quantized, but config.json has no quantization_config that says how"
        )
    if not all(stored):
        raise ValueError(f"{', '.join(modules)} are fused into one GEMM but only some of them are quantized")
    return concat_outputs([_read_one(source, module, quant) for module in modules])


def quantize_at_load(weight: torch.Tensor, quant: Quantization) -> QuantizedWeight:
    """A float [N, K] projection quantized as ``quant`` asks (round to nearest; int4 straight into
    the K-packed layout the GPU's 4-bit kernels read, zero points 0..15)."""
    if quant.method == "fp8":
        return quantize_fp8(weight)
    if quant.method == "awq":
        return quantize_awq(weight)
    return quantize_gptq(weight, zero_offset=quant.zero_offset)  # gptq, and int4 (offset 0)


def place_projection(
    weight: Weight, quant: Quantization | None, plan: QuantPlan, dtype: torch.dtype, device: torch.device
) -> Weight:
    """A projection as the model will hold it: quantized at load where asked, on ``device``,
    dense in ``dtype`` where the plan dequantizes at load, else with its kernels attached (an AWQ
    weight repacked into the K-packed layout the 4-bit kernels read, exactly)."""
    if isinstance(weight, torch.Tensor):
        if quant is None or not quant.at_load:
            return weight
        weight = quantize_at_load(weight, quant)
    placed = weight.to(device)
    if plan.dequantize_at_load:
        return dequantize(placed, dtype)
    if placed.kind == "awq" and plan.int4 != "dequantize":
        placed = awq_as_gptq(placed)
    return prepare_quantized(placed, plan, dtype)
