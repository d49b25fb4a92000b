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
from .paged_attention import paged_attention as paged_attention
from .paged_attention import reference_paged_attention as reference_paged_attention
from .paged_attention import write_kv as write_kv
