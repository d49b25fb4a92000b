"""The engine's LoRA plan: built once from EngineConfig and the device."""

from __future__ import annotations

import pytest
import torch

from multilora_studio.engine.config import EngineConfig
from multilora_studio.engine.step.lora_plan_builder import build_lora_plan, shrink_in_gemm_rows
from multilora_studio.kernels.lora_plan import LoRAPlan
from multilora_studio.kernels.triton_support import interpreting

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


def shrinks_in_gemm(config: EngineConfig, device: torch.device) -> bool:
    return build_lora_plan(config, device, torch.bfloat16).shrink_in_gemm


def test_shrink_in_gemm_is_on_for_cuda_with_few_slot_rows_unless_set():
    assert shrinks_in_gemm(EngineConfig(max_loras=32, max_lora_rank=16), CUDA)
    assert not shrinks_in_gemm(EngineConfig(max_loras=64, max_lora_rank=32), CUDA)  # 2048 rows a slice
    assert not shrinks_in_gemm(EngineConfig(), CPU)
    assert shrinks_in_gemm(EngineConfig(lora_shrink_in_gemm=True), CPU)
    assert not shrinks_in_gemm(EngineConfig(max_loras=4, lora_shrink_in_gemm=False), CUDA)


def test_shrink_in_gemm_reserves_every_slots_rows_at_the_largest_rank():
    config = EngineConfig(max_loras=6, max_lora_rank=8)
    assert shrink_in_gemm_rows(config, LoRAPlan(shrink_in_gemm=True)) == 48
    assert shrink_in_gemm_rows(config, LoRAPlan()) == 0


def test_fused_qkv_epilogue_is_on_for_cuda_unless_the_config_says():
    assert build_lora_plan(EngineConfig(), CUDA, torch.bfloat16).fused_qkv
    assert not build_lora_plan(EngineConfig(), CPU, torch.float32).fused_qkv
    assert not build_lora_plan(EngineConfig(fused_qkv_epilogue=False), CUDA, torch.bfloat16).fused_qkv
    # on the CPU only where Triton runs there (the interpreter, as the tests run)
    assert (
        build_lora_plan(EngineConfig(fused_qkv_epilogue=True), CPU, torch.float32).fused_qkv == interpreting()
    )


def test_the_kernels_follow_the_device_and_dtype():
    assert build_lora_plan(EngineConfig(), CUDA, torch.bfloat16).backend == "triton"
    cpu_float32 = build_lora_plan(EngineConfig(), CPU, torch.float32)
    assert cpu_float32.backend in ("numba", "torch") and not cpu_float32.pdl
    assert build_lora_plan(EngineConfig(), CPU, torch.bfloat16).backend == "torch"


def test_batch_invariance_pins_every_token_count_switch():
    for device, dtype in ((CPU, torch.float32), (CPU, torch.bfloat16), (CUDA, torch.bfloat16)):
        config = EngineConfig(batch_invariant=True, max_num_batched_tokens=4096)
        plan = build_lora_plan(config, device, dtype)
        assert plan.batch_invariant and plan.gemm_row_tile >= 1
        assert not plan.shrink_in_gemm and not plan.shrinks_in_gemm(1)
        for tokens in (1, 7, 64, 65, 257, 4096):  # one path at every token count the engine runs
            assert plan.uses_bgmv(tokens) == (device.type == "cuda")
            assert plan.uses_numba(tokens) == (plan.backend == "numba")
            assert not plan.stacks(tokens, 8)
        assert not build_lora_plan(EngineConfig(), device, dtype).batch_invariant


def test_batch_invariance_refuses_the_shrink_in_gemm():
    with pytest.raises(ValueError, match="lora_shrink_in_gemm"):
        build_lora_plan(EngineConfig(batch_invariant=True, lora_shrink_in_gemm=True), CUDA, torch.bfloat16)
