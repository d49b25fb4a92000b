"""Triton kernels and their torch implementations (import name ``multilora_studio.kernels``)."""

from .fused_ops import add_rms_norm, rms_norm, rope_, silu_and_mul
from .lora import (
    LoRABatch,
    LoRAPlan,
    add_lora,
    add_rms_norm_lora,
    build_lora_batch,
    lora_expand,
    lora_expand_shrunk_in_gemm,
    lora_shrink,
    qkv_rope_write,
    silu_and_mul_lora,
)
from .lora_reference import reference_lora, reference_shrink
from .paged_attention import paged_attention, reference_paged_attention, write_kv

__all__ = [
    "LoRABatch",
    "LoRAPlan",
    "add_lora",
    "add_rms_norm",
    "add_rms_norm_lora",
    "build_lora_batch",
    "lora_expand",
    "lora_expand_shrunk_in_gemm",
    "lora_shrink",
    "paged_attention",
    "qkv_rope_write",
    "reference_lora",
    "reference_paged_attention",
    "reference_shrink",
    "rms_norm",
    "rope_",
    "silu_and_mul",
    "silu_and_mul_lora",
    "write_kv",
]
