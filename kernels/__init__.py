"""Triton kernels and their torch implementations (import name ``multilora_studio.kernels``)."""

from .fused_ops import add_rms_norm, rms_norm, rope_, silu_and_mul
from .lora import (
    LoRABatch,
    add_lora,
    build_lora_batch,
    lora_expand,
    lora_expand_gathered,
    lora_shrink,
    reference_lora,
    reference_shrink,
)
from .paged_attention import paged_attention, reference_paged_attention, write_kv

__all__ = [
    "LoRABatch",
    "add_lora",
    "add_rms_norm",
    "build_lora_batch",
    "lora_expand",
    "lora_expand_gathered",
    "lora_shrink",
    "paged_attention",
    "reference_lora",
    "reference_paged_attention",
    "reference_shrink",
    "rms_norm",
    "rope_",
    "silu_and_mul",
    "write_kv",
]
