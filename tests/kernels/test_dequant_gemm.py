"""The dequantize-GEMM (AWQ, GPTQ with and without act-order, FP8) against a float64
dequantize-then-matmul reference, at decode and prefill row counts; and the base GEMM's
dispatch (``quant_linear``) on each path of the plan.

Tolerances (relative to the largest reference value of the output): float32 1e-5 (the kernel
accumulates in float32 over K <= 512), bfloat16 2e-2 (the activations and each dequantized
weight are rounded to bfloat16 once, as the GPU runs them).
"""

from __future__ import annotations

import pytest
import torch

from multilora_studio.engine.model.quant_pack import (
    group_contiguous,
    quantize_awq,
    quantize_fp8,
    quantize_gptq,
)
from multilora_studio.kernels.dequant_gemm import (
    DECODE_PROGRAMS,
    TileConfig,
    dequant_gemm,
    split_k,
    tile_config,
)
from multilora_studio.kernels.quant_linear import QuantPlan, fp8_scaled_mm, quant_linear, quantize_rows_fp8
from multilora_studio.kernels.quant_weight import QuantizedWeight, concat_outputs, dequantize
from tests.kernels.device import DEVICE

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def make_weight(kind: str, n: int, k: int, seed: int) -> QuantizedWeight:
    generator = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=generator) * 0.05
    if kind == "fp8":
        return quantize_fp8(w)
    if kind == "awq":
        return quantize_awq(w)
    if kind == "gptq-v2":
        return quantize_gptq(w, zero_offset=0)
    weight = quantize_gptq(w)
    if kind == "gptq-act-order":  # rows in input-feature order with g_idx, repacked by group
        order = torch.randperm(k, generator=generator)
        g_idx = torch.empty(k, dtype=torch.int64)
        g_idx[order] = torch.arange(k) // 128
        weight = group_contiguous(weight, g_idx)
        assert k == 128 or (
            weight.perm is not None and torch.equal(weight.perm.sort().values, torch.arange(k))
        )
    return weight


def check(y: torch.Tensor, x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None) -> None:
    reference = x.double() @ dequantize(weight, torch.float64).T  # [T, N]
    if bias is not None:
        reference += bias.double()
    scale = reference.abs().max().item()
    error = (y.double() - reference).abs().max().item()
    assert error <= TOLERANCE[x.dtype] * scale, (error, scale)


CASES = [
    ("awq", 1, 256, 128, torch.float32),
    ("awq", 1, 64, 512, torch.float32),  # K split in 4, with a bias
    ("awq", 37, 96, 256, torch.bfloat16),
    ("gptq", 3, 128, 256, torch.float32),
    ("gptq", 70, 64, 128, torch.float32),
    ("gptq-v2", 16, 64, 256, torch.bfloat16),
    ("gptq-act-order", 5, 96, 256, torch.float32),
    ("gptq-act-order", 33, 64, 384, torch.bfloat16),
    ("fp8", 1, 80, 72, torch.float32),
    ("fp8", 20, 48, 200, torch.bfloat16),
]


@pytest.mark.parametrize(("kind", "rows", "n", "k", "dtype"), CASES)
def test_dequant_gemm_equals_the_float64_reference(kind, rows, n, k, dtype):
    weight = make_weight(kind, n, k, seed=rows + n).to(torch.device(DEVICE))
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, k, generator=generator).to(DEVICE, dtype)
    bias = torch.randn(n, generator=generator).to(DEVICE, dtype) if rows % 2 else None
    y = dequant_gemm(x, weight, bias)
    assert y.dtype == dtype and y.shape == (rows, n)
    check(y, x, weight, bias)


LAUNCHES = [
    TileConfig(16, 64, 128, 4, stages=2, splits=2),
    TileConfig(16, 128, 64, 8, stages=4, splits=1, gather=True),  # fits in 227 KiB of shared memory
    TileConfig(16, 256, 64, 4, splits=3, gather=True),  # three parts of an uneven K
    TileConfig(1, 64, 128, 4, splits=2, gemv=True),
    TileConfig(1, 128, 64, 8, gather=True, gemv=True),
    TileConfig(16, 64, 128, 4, splits=2, fp32_operands=True),
]


@pytest.mark.parametrize("config", LAUNCHES, ids=str)
@pytest.mark.parametrize("kind", ["awq", "gptq-act-order", "fp8"])
def test_every_launch_computes_the_same_product(kind, config):
    """Tiles, splits, pipelining and gathered words change how the product is computed, not its
    value (the launch a benchmark picks for a GPU is one of these)."""
    weight = make_weight(kind, 256, 384, seed=7).to(torch.device(DEVICE))
    x = torch.randn(3, 384, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    bias = torch.randn(256, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    check(dequant_gemm(x, weight, bias, config), x, weight, bias)


@pytest.mark.skipif(
    DEVICE != "cuda" or not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
    reason="the device's own e4m3 conversion needs compute capability >= 8.9 (a GPU host runs it)",
)
def test_native_e4m3_conversion_equals_the_decoded_bits():
    weight = make_weight("fp8", 256, 384, seed=8).to(torch.device(DEVICE))
    x = torch.randn(16, 384, device=DEVICE, dtype=torch.bfloat16)
    native = TileConfig(**{**tile_config(16).__dict__, "native_fp8": True})
    assert torch.equal(dequant_gemm(x, weight, config=native), dequant_gemm(x, weight))


def test_decode_splits_k_until_the_gpu_is_busy():
    assert split_k(1, 64, 32) == DECODE_PROGRAMS // 64  # [4096, 4096] at decode: 64 tiles x 4
    assert split_k(1, 448, 32) == 1  # gate_up [28672, 4096]: its tiles are enough
    assert split_k(1, 2, 3) == 3  # never more parts than K blocks
    assert split_k(64, 2, 32) == 1  # prefill: no split


def test_every_e4m3_byte_decodes_to_its_value():
    codes = torch.arange(256, dtype=torch.int32)
    codes[(codes & 0x7F) == 0x7F] = 0  # the two NaN codes: no weight holds them
    q = codes.to(torch.uint8).view(torch.float8_e4m3fn).view(2, 128).to(DEVICE)  # both signs, subnormals
    weight = QuantizedWeight("fp8", (2, 128), q, torch.ones(2, device=DEVICE))
    y = dequant_gemm(torch.eye(128, device=DEVICE), weight)  # [128, 2]: row k is W[:, k]
    assert torch.equal(y.t(), q.float())


def test_dequant_gemm_reads_strided_rows_and_no_rows():
    weight = make_weight("awq", 64, 128, seed=3).to(torch.device(DEVICE))
    x = torch.randn(6, 256, device=DEVICE)[:, :128]  # rows 256 apart
    check(dequant_gemm(x, weight), x, weight, None)
    assert dequant_gemm(torch.empty(0, 128, device=DEVICE), weight).shape == (0, 64)


def test_dequant_gemm_refuses_what_it_cannot_multiply():
    weight = make_weight("gptq", 64, 128, seed=4)
    with pytest.raises(ValueError, match=r"x must be \[T, 128\]"):
        dequant_gemm(torch.randn(2, 64), weight)
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        dequant_gemm(torch.randn(2, 128).double(), weight)
    with pytest.raises(ValueError, match=r"bias must be \[64\]"):
        dequant_gemm(torch.randn(2, 128), weight, torch.zeros(3))
    with pytest.raises(ValueError, match="contiguous"):
        dequant_gemm(torch.randn(128, 2).t(), weight)


def test_fused_parts_concatenate_their_outputs():
    parts = [make_weight("awq", n, 128, seed=n).to(torch.device(DEVICE)) for n in (64, 32, 32)]
    fused = concat_outputs(parts)
    assert fused.shape == (128, 128)
    assert torch.equal(
        dequantize(fused, torch.float64), torch.cat([dequantize(p, torch.float64) for p in parts])
    )
    x = torch.randn(4, 128, device=DEVICE)
    check(dequant_gemm(x, fused), x, fused, None)
    act_order = [make_weight("gptq-act-order", 64, 256, seed=s) for s in (1, 2)]
    with pytest.raises(ValueError, match="act-order permutation"):
        concat_outputs(act_order)


@pytest.mark.parametrize("path", ["triton", "dequantize"])
@pytest.mark.parametrize("kind", ["awq", "fp8"])
def test_quant_linear_runs_each_path_of_the_plan(kind, path):
    plan = QuantPlan(dequantize_at_load=False, fp8=path, int4=path)
    weight = make_weight(kind, 64, 128, seed=9).to(torch.device(DEVICE))
    x = torch.randn(3, 128, device=DEVICE)
    bias = torch.randn(64, device=DEVICE)
    check(quant_linear(x, weight, bias, plan=plan), x, weight, bias)
    dense = torch.randn(64, 128, device=DEVICE)
    assert torch.equal(quant_linear(x, dense, plan=plan), torch.nn.functional.linear(x, dense))


def test_quant_plan_refuses_unknown_paths():
    with pytest.raises(ValueError, match="fp8 must be one of"):
        QuantPlan(fp8="cutlass")
    with pytest.raises(ValueError, match="int4 must be one of"):
        QuantPlan(int4="marlin")


def test_per_token_activation_quantization_is_within_e4m3_precision():
    x = torch.randn(5, 64) * torch.tensor([[0.01], [1.0], [30.0], [1e-3], [5.0]])
    xq, scales = quantize_rows_fp8(x)
    assert xq.dtype == torch.float8_e4m3fn and scales.shape == (5, 1)
    back = xq.float() * scales
    assert torch.all((back - x).abs() <= x.abs().amax(1, keepdim=True) * 2**-4)  # 3 mantissa bits


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
    reason="torch._scaled_mm's FP8 GEMM needs a GPU of compute capability >= 8.9 (a GPU host runs it)",
)
def test_fp8_scaled_mm_equals_its_semantics():
    weight = make_weight("fp8", 256, 512, seed=5).to(torch.device("cuda"))
    x = torch.randn(9, 512, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    xq, sx = quantize_rows_fp8(x)
    reference = (xq.double() * sx.double()) @ dequantize(weight, torch.float64).T + bias.double()
    y = fp8_scaled_mm(x, weight, bias)
    assert (y.double() - reference).abs().max() <= 2e-2 * reference.abs().max()
