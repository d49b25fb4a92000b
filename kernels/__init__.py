"""Triton kernels and their torch implementations (import name ``multilora_studio.kernels``)."""

from .lora import (
    LoRABatch,
    add_lora,
    build_lora_batch,
    lora_expand,
    lora_shrink,
    reference_lora,
    reference_shrink,
)
