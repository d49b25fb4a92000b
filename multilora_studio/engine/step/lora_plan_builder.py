"""The engine's LoRA plan: built once at start-up from ``EngineConfig``, the device and the dtype.

Every choice of how the LoRA term runs is made here (the kernels' own choice for the device,
``LoRAPlan.for_device``, plus the engine's options); the runner hands the plan to the model,
and the model to every LoRA wrapper it calls.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from multilora_studio.engine.config import EngineConfig
from multilora_studio.invalid_setting import InvalidSetting
from multilora_studio.kernels import lora_cpu
from multilora_studio.kernels.lora_plan import LoRAPlan
from multilora_studio.kernels.triton_support import triton_runs_on

# max_loras x max_lora_rank up to which CUDA engines compute the LoRA shrink in the base GEMMs:
# on the H200 it was faster at any adapter mix with 512 rows a slice, slower with 1024
# (docs/dev/kernels.md).
SHRINK_IN_GEMM_MAX_ROWS = 768
# Rows per GEMM call in batch-invariant mode (kernels/row_tiles.py), per device type. CPU: a
# single stream's decode then computes 8 rows for its one and ran at 0.8-0.9 of the default
# speed (docs/BENCHMARKS.md, "Batch invariance (CPU)"). CUDA: 64, a tile of the size the GEMM
# kernels block rows in; decode then ran at 0.88-0.93 of the default speed on an H200
# (docs/BENCHMARKS.md, "Batch-invariant mode").
INVARIANT_ROW_TILE = {"cpu": 8, "cuda": 64}


def build_lora_plan(
    config: EngineConfig, device: torch.device, dtype: torch.dtype, quantized: bool = False
) -> LoRAPlan:
    """The plan of an engine with ``config`` on ``device`` computing in ``dtype`` (``quantized``:
    over a quantized base).

    ``lora_shrink_in_gemm`` None: on CUDA when ``max_loras x max_lora_rank <=
    SHRINK_IN_GEMM_MAX_ROWS``, never on the CPU, never over a quantized base (its A rows cannot
    be appended to packed weights: the shrink kernels run; True there is a ValueError).
    ``fused_qkv_epilogue`` None: on CUDA; True also elsewhere where Triton runs (the CPU under
    ``TRITON_INTERPRET=1``, as the tests do), the separate launches otherwise.
    """
    if quantized and config.lora_shrink_in_gemm:
        raise ValueError(
            "lora_shrink_in_gemm=True cannot be combined with a quantized base: LoRA A rows cannot be "
            "appended to its packed weights"
        )
    if quantized:
        shrink_in_gemm = False
    elif config.lora_shrink_in_gemm is not None:
        shrink_in_gemm = config.lora_shrink_in_gemm
    else:
        shrink_in_gemm = (
            device.type == "cuda" and config.max_loras * config.max_lora_rank <= SHRINK_IN_GEMM_MAX_ROWS
        )
    fused_qkv = config.fused_qkv_epilogue if config.fused_qkv_epilogue is not None else device.type == "cuda"
    plan = replace(
        LoRAPlan.for_device(device, dtype),
        shrink_in_gemm=shrink_in_gemm,
        fused_qkv=fused_qkv and triton_runs_on(device),
    )
    return batch_invariant_plan(config, device, plan) if config.batch_invariant else plan


def batch_invariant_plan(config: EngineConfig, device: torch.device, plan: LoRAPlan) -> LoRAPlan:
    """``plan`` with every choice that depends on a step's token or adapter count pinned to one.

    - Triton: the token-major kernels at every token count (each token's shrink and expand is
      its own program; their K split depends on the shapes only), no shrink in GEMM (its
      folded expands switch with the token count).
    - Numba: the compiled kernel (one token at a time) at every token count.
    - torch: never the stacked path, and the per-adapter GEMMs in row tiles.
    - every dense GEMM in tiles of ``INVARIANT_ROW_TILE`` rows, attention in one order.
    """
    if device.type != "cuda" and not lora_cpu.AVAILABLE:
        raise InvalidSetting(
            "{batch_invariant} needs Numba on the CPU (its attention kernel); install numba",
            {"batch_invariant": True},
        )
    if config.lora_shrink_in_gemm:
        raise InvalidSetting(
            "{batch_invariant} cannot be combined with {lora_shrink_in_gemm:=}",
            {"batch_invariant": True, "lora_shrink_in_gemm": True},
        )
    return replace(
        plan,
        batch_invariant=True,
        gemm_row_tile=INVARIANT_ROW_TILE["cuda" if device.type == "cuda" else "cpu"],
        bgmv_max_tokens=max(plan.bgmv_max_tokens, config.max_num_batched_tokens),
        numba_max_tokens=max(plan.numba_max_tokens, config.max_num_batched_tokens),
        stacked_max_tokens=0,
        shrink_in_gemm=False,
    )


def shrink_in_gemm_rows(config: EngineConfig, plan: LoRAPlan) -> int:
    """LoRA A rows per slice to reserve after every GEMM weight (every slot's, at the largest
    rank) when ``plan`` computes the shrink in the base GEMMs; 0 otherwise."""
    return config.max_loras * config.max_lora_rank if plan.shrink_in_gemm else 0
