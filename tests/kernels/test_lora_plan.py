"""LoRAPlan: validated on construction; its thresholds say which kernels run at which token counts."""

from __future__ import annotations

import pytest
import torch

from multilora_studio.kernels import lora_cpu
from multilora_studio.kernels.lora_plan import FOLDED_EXPAND_MAX_RANK, LoRAPlan


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(backend="cuda"), "backend must be one of"),
        (dict(bgmv_max_tokens=-1), "bgmv_max_tokens must be a non-negative int"),
        (dict(numba_max_tokens=1.5), "numba_max_tokens must be a non-negative int"),
        (dict(stacked_min_adapters=True), "stacked_min_adapters must be a non-negative int"),
        (dict(shrink_in_gemm=1), "shrink_in_gemm must be True or False"),
        (dict(pdl="no"), "pdl must be True or False"),
        (dict(bgmv_expand_tile=1000), "bgmv_expand_tile must be a power of two >= 256"),
        (dict(bgmv_shrink_tile=128), "bgmv_shrink_tile must be a power of two >= 256"),
        (dict(bgmv_expand_warps=3), "bgmv_expand_warps must be a power of two >= 1"),
    ],
)
def test_bad_plans_raise_value_error_naming_the_field(settings, message):
    with pytest.raises(ValueError, match=message):
        LoRAPlan(**settings)


def test_the_kernels_own_choice_follows_the_device_and_dtype():
    cpu32 = LoRAPlan.for_device("cpu", torch.float32)
    assert cpu32.backend == ("numba" if lora_cpu.AVAILABLE else "torch")
    assert not (cpu32.shrink_in_gemm or cpu32.fused_qkv or cpu32.pdl)
    assert LoRAPlan.for_device("cpu", torch.bfloat16).backend == "torch"


def test_token_counts_pick_the_kernels():
    plan = LoRAPlan(backend="triton", bgmv_max_tokens=8, shrink_in_gemm=True)
    assert plan.uses_bgmv(8) and not plan.uses_bgmv(9)
    assert plan.shrinks_in_gemm(8) and not plan.shrinks_in_gemm(9)
    assert plan.folds_expand(8, FOLDED_EXPAND_MAX_RANK) and not plan.folds_expand(
        8, FOLDED_EXPAND_MAX_RANK + 1
    )
    assert not LoRAPlan(backend="torch").folds_expand(1, 8)  # only the Triton kernels fold
    assert not LoRAPlan(backend="torch", shrink_in_gemm=False).shrinks_in_gemm(1)
    torch_plan = LoRAPlan(backend="torch", stacked_max_tokens=4, stacked_min_adapters=2)
    assert torch_plan.stacks(4, 2) and not torch_plan.stacks(5, 2) and not torch_plan.stacks(4, 1)
    if lora_cpu.AVAILABLE:
        numba = LoRAPlan(backend="numba", numba_max_tokens=3)
        assert numba.uses_numba(3) and not numba.uses_numba(4)
