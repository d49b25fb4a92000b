"""The base model and its LoRA slots, put together on the device once per engine."""

from __future__ import annotations

import torch

from multilora_studio.engine.config import EngineConfig
from multilora_studio.engine.model.dora import BaseProjection, base_row_norms
from multilora_studio.engine.model.llama import LlamaModel
from multilora_studio.engine.model.lora_weights import LoRASlotWeights
from multilora_studio.engine.model.model_spec import ModelSpec
from multilora_studio.engine.model.token_tables import TokenTablePool
from multilora_studio.engine.model.weights import ModelWeights, pack_for_onednn
from multilora_studio.kernels.cpu_linear import onednn_packing_available
from multilora_studio.kernels.lora import LoRAPlan
from multilora_studio.kernels.quant_linear import QuantPlan


def cpu_packing_enabled(config: EngineConfig, dtype: torch.dtype) -> bool:
    """Whether the CPU base GEMMs run on oneDNN-packed weights (``EngineConfig.cpu_weight_packing``)."""
    return config.cpu_weight_packing and onednn_packing_available(dtype)


def build_device_model(
    config: EngineConfig,
    spec: ModelSpec,
    weights: ModelWeights,
    device: torch.device,
    dtype: torch.dtype,
    plan: LoRAPlan,
    quant_plan: QuantPlan | None,
) -> tuple[LlamaModel, LoRASlotWeights]:
    """The forward pass over ``weights`` (oneDNN-packed in place on the CPU where that is on)
    and the LoRA slots it reads: ``max_loras`` of ``max_lora_rank``, DoRA's base norms, and the
    pool of the adapters' token tables."""

    def project_base(group: str, layer: int, x: torch.Tensor) -> torch.Tensor:
        """``x @ W^T`` of layer ``layer``'s ``group`` base weight (DoRA's norms; once ``model`` is made)."""
        return model.linear(x, getattr(weights.layers[layer], group))

    dora_base = BaseProjection(base_row_norms(weights, spec.lora_groups), project_base)  # before repacking
    if device.type == "cpu" and cpu_packing_enabled(config, dtype) and not plan.shrink_in_gemm:
        pack_for_onednn(weights)  # in place: ~1.7x faster decode GEMMs on the CPU
    # With the shrink in GEMM the slots' A factors are extra rows of the base GEMM weights.
    table_bytes = int(config.token_table_memory_gb * (1 << 30))
    lora = LoRASlotWeights(
        spec,
        config.max_loras,
        config.max_lora_rank,
        dtype,
        device,
        weights.shrink_in_gemm_weights,
        dora_base,
        TokenTablePool(config.max_token_tables, table_bytes, device),
    )
    max_positions = max(config.max_model_len, 16)
    model = LlamaModel(spec, weights, lora, max_positions, plan, quant_plan)
    return model, lora
