"""Quantized checkpoints of a tiny random Llama, stored as the Hub stores each format, and their
dequantized float twins (what PEFT and the float64 references run on).

FP8: quantized and written by ``compressed-tensors`` itself (``float-quantized``, per-channel
scales, as llm-compressor writes FP8 checkpoints), or as vLLM's ``fp8`` format (one scale per
tensor). AWQ / GPTQ: packed by ``engine/model/quant_pack.py`` (checked against the formats'
documented words in tests/engine/test_quant_formats.py); act-order GPTQ stores its rows in
input-feature order with ``g_idx``, as AutoGPTQ does. The dequantized twins are computed here
by ``reference_dequantize``, written from the documented layouts, not by the engine's code.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from multilora_studio.engine.model.quant_pack import int4_groups, pack_awq, pack_gptq_rows, pack_sequential
from tests.fixtures import TinyVariant, build_tiny_model

# K = 128 (hidden) and 256 (intermediate): whole groups of 128; head_dim 32
QUANT_VARIANT = TinyVariant(
    "llama",
    (
        ("hidden_size", 128),
        ("intermediate_size", 256),
        ("num_attention_heads", 4),
        ("num_key_value_heads", 2),
    ),
)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# projections fused into one GEMM share their act-order permutation (the same inputs, so GPTQ
# computes the same Hessian order for them)
ORDER_GROUPS = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gu", "up_proj": "gu"}
FORMATS = ("fp8-channel", "fp8-tensor", "awq", "gptq", "gptq-act-order")
AWQ_COLUMN_OF_NIBBLE = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ's pack order: nibble i holds column order[i]


def nibbles(words: torch.Tensor) -> list[torch.Tensor]:
    """The eight 4-bit fields of int32 words, lowest first."""
    return [(words >> (4 * i)) & 0xF for i in range(8)]


def reference_dequantize(kind: str, tensors: dict[str, torch.Tensor], module: str) -> torch.Tensor:
    """[N, K] float64 weight of ``module`` from its stored tensors, following each format's
    documented layout step by step."""
    if kind.startswith("fp8"):
        q = tensors[f"{module}.weight"].double()  # [N, K]
        scale = tensors[f"{module}.weight_scale"].double().reshape(-1)
        return q * (scale if scale.numel() == 1 else scale.unsqueeze(1))
    qweight, qzeros, scales = (tensors[f"{module}.{n}"] for n in ("qweight", "qzeros", "scales"))
    if kind == "awq":  # qweight [K, N / 8]: column 8 c + order[i] in nibble i
        k, words = qweight.shape
        q = torch.empty((k, words * 8), dtype=torch.int64)
        z = torch.empty((qzeros.shape[0], words * 8), dtype=torch.int64)
        for i, (qi, zi) in enumerate(zip(nibbles(qweight), nibbles(qzeros), strict=True)):
            q[:, AWQ_COLUMN_OF_NIBBLE[i] :: 8] = qi
            z[:, AWQ_COLUMN_OF_NIBBLE[i] :: 8] = zi
        groups = torch.arange(k) // 128
    else:  # gptq: qweight [K / 8, N], row 8 r + i in nibble i; zeros stored minus one
        rows, n = qweight.shape
        q = torch.empty((rows * 8, n), dtype=torch.int64)
        for i, qi in enumerate(nibbles(qweight)):
            q[i::8] = qi
        z = torch.empty((qzeros.shape[0], n), dtype=torch.int64)
        for i, zi in enumerate(nibbles(qzeros)):
            z[:, i::8] = zi + 1
        groups = tensors[f"{module}.g_idx"].long()
    return ((q - z[groups]).double() * scales.double()[groups]).t()  # [N, K]


def _quantize_module(kind: str, weight: torch.Tensor, order: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """The stored tensors of one [N, K] projection (names without the module prefix)."""
    if kind == "fp8-tensor":
        scale = weight.abs().max() / 448.0
        return {
            "weight": (weight / scale).clamp(-448, 448).to(torch.float8_e4m3fn),
            "weight_scale": scale.reshape(()).float(),
        }
    if kind == "awq":
        q, zeros, scales = int4_groups(weight)
        return {"qweight": pack_awq(q), "qzeros": pack_awq(zeros), "scales": scales}
    k = weight.shape[1]
    if order is None:  # groups of consecutive rows
        q, zeros, scales = int4_groups(weight, min_zero=1)
        g_idx = torch.arange(k, dtype=torch.int32) // 128
    else:  # act-order: row order[j] is the j-th quantized, in group j // 128
        q_ordered, zeros, scales = int4_groups(weight[:, order], min_zero=1)
        q = torch.empty_like(q_ordered)
        q[order] = q_ordered  # stored in input-feature order
        g_idx = torch.empty(k, dtype=torch.int32)
        g_idx[order] = (torch.arange(k) // 128).to(torch.int32)
    return {
        "qweight": pack_gptq_rows(q),
        "qzeros": pack_sequential(zeros - 1),
        "scales": scales,
        "g_idx": g_idx,
    }


QUANT_CONFIGS = {
    "fp8-tensor": {"quant_method": "fp8", "activation_scheme": "dynamic"},
    "awq": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"},
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": False},
    "gptq-act-order": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True, "sym": False},
}


def _compressed_tensors_fp8(float_dir: Path, target: Path) -> None:
    """FP8 per channel through compressed-tensors: its scheme, its scale rule, its compressor."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        apply_quantization_config,
        preset_name_to_scheme,
    )
    from compressed_tensors.quantization.utils import calculate_qparams
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(float_dir), dtype=torch.float32)
    scheme = preset_name_to_scheme("FP8_DYNAMIC", ["Linear"])
    apply_quantization_config(
        model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"])
    )
    for module in model.modules():
        if hasattr(module, "weight_scale"):
            w = module.weight.data
            scale, _ = calculate_qparams(
                w.amin(1, keepdim=True), w.amax(1, keepdim=True), module.quantization_scheme.weights
            )
            module.weight_scale.data.copy_(scale)
    compressor = ModelCompressor.from_pretrained_model(model, "float-quantized")
    compressor.compress_model(model)
    model.save_pretrained(str(target), safe_serialization=True)
    compressor.update_config(str(target))


def build_quantized(float_dir: Path, kind: str, target: Path) -> tuple[Path, Path]:
    """(the ``kind`` checkpoint of the float model at ``float_dir``, its dequantized float32 twin)."""
    quantized, dequantized = target / "quantized", target / "dequantized"
    for folder in (quantized, dequantized):
        shutil.copytree(float_dir, folder)
    tensors = load_file(str(float_dir / "model.safetensors"))
    modules = sorted({name.rsplit(".", 1)[0] for name in tensors if name.rsplit(".", 2)[-2] in PROJECTIONS})
    if kind == "fp8-channel":
        _compressed_tensors_fp8(float_dir, quantized)
        stored = load_file(str(quantized / "model.safetensors"))
    else:
        generator = torch.Generator().manual_seed(7)
        orders: dict[tuple[str, str], torch.Tensor] = {}
        stored = {name: t for name, t in tensors.items() if name.rsplit(".", 1)[0] not in modules}
        for module in modules:
            weight = tensors[f"{module}.weight"]
            order = None
            if kind == "gptq-act-order":
                layer, name = module.rsplit(".", 2)[0], module.rsplit(".", 1)[1]
                key = (layer, ORDER_GROUPS.get(name, name))
                if key not in orders:
                    orders[key] = torch.randperm(weight.shape[1], generator=generator)
                order = orders[key]
            for suffix, tensor in _quantize_module(kind, weight, order).items():
                stored[f"{module}.{suffix}"] = tensor.contiguous()
        save_file(stored, str(quantized / "model.safetensors"), metadata={"format": "pt"})
        config = json.loads((quantized / "config.json").read_text())
        config["quantization_config"] = QUANT_CONFIGS[kind]
        (quantized / "config.json").write_text(json.dumps(config, indent=2))
    twin = dict(tensors)
    for module in modules:
        twin[f"{module}.weight"] = reference_dequantize(kind, stored, module).float().contiguous()
    save_file(twin, str(dequantized / "model.safetensors"), metadata={"format": "pt"})
    return quantized, dequantized


def build_quant_base(tokenizer_dir: Path | None, target: Path) -> Path:
    """The float tiny model the quantized checkpoints are made from (hidden 128, 3 layers)."""
    return build_tiny_model(tokenizer_dir, target, variant=QUANT_VARIANT)
