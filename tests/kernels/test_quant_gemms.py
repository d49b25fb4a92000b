"""The GPU's quantized GEMMs against a float64 dequantize-then-matmul reference: the 4-bit
dequantize kernel (bit for bit), AWQ repacked into the K-packed layout (bit for bit), the
cuBLAS paths of ``Int4Gemm`` and ``Fp8Gemm`` at decode and prefill row counts, gemlite's
kernels on a GPU host, and the base GEMM's dispatch (``quant_linear``) on each path of the plan.

Tolerances (relative to the largest reference value of the output): float32 1e-5, bfloat16
2e-2 (the activations and each dequantized weight are rounded to bfloat16 once, as the GPU
runs them).
"""

from __future__ import annotations

import pytest
import torch

from multilora_studio.engine.model.quant_pack import (
    awq_as_gptq,
    group_contiguous,
    quantize_awq,
    quantize_fp8,
    quantize_gptq,
)
from multilora_studio.kernels.fp8_gemm import TENSOR_CORES_FROM_ROWS, Fp8Gemm
from multilora_studio.kernels.fp8_scaled_mm import fp8_scaled_mm, quantize_rows_fp8
from multilora_studio.kernels.gemlite_support import gemlite_available, launch_table
from multilora_studio.kernels.int4_dequant import dequantize_kn
from multilora_studio.kernels.int4_gemm import DENSE_FROM_ROWS, Int4Gemm
from multilora_studio.kernels.quant_linear import QuantPlan, prepare_quantized, quant_linear
from multilora_studio.kernels.quant_weight import (
    QuantizedWeight,
    concat_outputs,
    dequantize,
    unpack_sequential,
)
from tests.kernels.device import DEVICE

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
GEMLITE = DEVICE == "cuda" and gemlite_available()
needs_gemlite = pytest.mark.skipif(
    not GEMLITE, reason="gemlite runs on CUDA (a GPU host with gemlite runs it)"
)


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


def k_packed(kind: str, n: int, k: int, seed: int) -> QuantizedWeight:
    """A 4-bit weight as the GPU holds it: in the K-packed layout (AWQ repacked)."""
    weight = make_weight(kind, n, k, seed)
    return awq_as_gptq(weight) if kind == "awq" else weight


def check(y: torch.Tensor, x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None) -> None:
    reference = x.double() @ dequantize(weight, torch.float64).T  # [T, N]
    if bias is not None:
        reference += bias.double()
    scale = reference.abs().max().item()
    error = (y.double() - reference).abs().max().item()
    assert error <= TOLERANCE[x.dtype] * scale, (error, scale)


@pytest.mark.parametrize(("n", "k"), [(64, 128), (96, 384), (200, 256)])
def test_awq_repacked_along_k_dequantizes_bit_for_bit(n, k):
    awq = make_weight("awq", n, k, seed=n + k)
    repacked = awq_as_gptq(awq)
    assert repacked.kind == "gptq" and repacked.zero_offset == 0 and repacked.shape == awq.shape
    assert repacked.nbytes == awq.nbytes  # the same bytes, laid out along K
    assert torch.equal(dequantize(repacked, torch.float64), dequantize(awq, torch.float64))
    with pytest.raises(ValueError, match="takes an awq weight"):
        awq_as_gptq(repacked)


@pytest.mark.parametrize("kind", ["awq", "gptq", "gptq-v2", "gptq-act-order"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_dequantize_kernel_is_exact_then_rounded_once(kind, dtype):
    """(q - z) * s is exact in float32 (a 5-bit integer times an fp16 scale), so the kernel's
    weight equals the float64 dequantization rounded once to the output dtype, bit for bit
    (on the GPU; the interpreter rounds bfloat16 its own way)."""
    weight = k_packed(kind, 192, 384, seed=3).to(torch.device(DEVICE))
    zeros = (unpack_sequential(weight.qzeros) + weight.zero_offset).half()
    out = torch.empty(384, 192, dtype=dtype, device=DEVICE)
    got = dequantize_kn(weight.qweight, zeros, weight.scales, 128, out)  # [K, N], stored row order
    exact = dequantize(weight, torch.float64)  # [N, K], input feature order
    if weight.perm is not None:
        exact = exact[:, weight.perm]  # stored row j is input feature perm[j]
    if DEVICE == "cuda" or dtype == torch.float32:
        assert torch.equal(got, exact.t().to(dtype))
    else:  # Triton's interpreter converts float32 to bfloat16 by truncation: one unit apart at most
        assert torch.allclose(got.double(), exact.t(), rtol=2**-7, atol=0)
    with pytest.raises(ValueError, match="dequantize_kn"):
        dequantize_kn(weight.qweight, zeros, weight.scales, 128, out[:100])


CASES = [
    ("awq", 1, 256, 128, torch.float32),
    ("awq", 37, 96, 256, torch.bfloat16),
    ("gptq", 3, 128, 256, torch.float32),
    ("gptq", DENSE_FROM_ROWS + 2, 64, 128, torch.float32),
    ("gptq-v2", 16, 64, 256, torch.bfloat16),
    ("gptq-act-order", 5, 96, 256, torch.float32),
    ("gptq-act-order", 33, 64, 384, torch.bfloat16),
]


@pytest.mark.parametrize(("kind", "rows", "n", "k", "dtype"), CASES)
def test_int4_cublas_path_equals_the_float64_reference(kind, rows, n, k, dtype):
    weight = k_packed(kind, n, k, seed=rows + n).to(torch.device(DEVICE))
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, k, generator=generator).to(DEVICE, dtype)
    bias = torch.randn(n, generator=generator).to(DEVICE, dtype) if rows % 2 else None
    y = Int4Gemm(weight, dtype, gemv=False)(x, bias)
    assert y.dtype == dtype and y.shape == (rows, n)
    check(y, x, weight, bias)


@pytest.mark.parametrize("rows", [1, 20, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_cublas_path_equals_the_float64_reference(rows, dtype):
    weight = make_weight("fp8", 80, 200, seed=rows).to(torch.device(DEVICE))
    x = torch.randn(rows, 200, generator=torch.Generator().manual_seed(rows)).to(DEVICE, dtype)
    bias = torch.randn(80).to(DEVICE, dtype)
    y = Fp8Gemm(weight, dtype, gemv=False, tensor_cores=False)(x, bias)
    check(y, x, weight, bias)


@needs_gemlite
@pytest.mark.parametrize("rows", [1, 2, 7, 16, 33, DENSE_FROM_ROWS - 1, DENSE_FROM_ROWS])
@pytest.mark.parametrize("kind", ["awq", "gptq", "gptq-act-order"])
def test_int4_gemlite_path_equals_the_float64_reference(kind, rows):
    """gemlite's GEMV, split-K and GEMM kernels (chosen by rows) and the dense path from
    ``DENSE_FROM_ROWS`` on, over one copy of the packed words."""
    weight = k_packed(kind, 512, 1024, seed=rows).to(torch.device("cuda"))
    gemm = Int4Gemm(weight, torch.bfloat16)
    assert gemm.layer.W_q.data_ptr() == weight.qweight.data_ptr()  # not a second copy
    x = torch.randn(rows, 1024, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(512, device="cuda", dtype=torch.bfloat16)
    check(gemm(x, bias), x, weight, bias)


@needs_gemlite
@pytest.mark.parametrize("rows", [1, 5, TENSOR_CORES_FROM_ROWS - 1, TENSOR_CORES_FROM_ROWS, 70])
def test_fp8_gemlite_path_equals_its_semantics(rows):
    weight = make_weight("fp8", 512, 1024, seed=rows).to(torch.device("cuda"))
    gemm = Fp8Gemm(weight, torch.bfloat16)
    assert gemm.layer.W_q.data_ptr() == weight.qweight.data_ptr()  # a view of the stored bytes
    x = torch.randn(rows, 1024, device="cuda", dtype=torch.bfloat16)
    y = gemm(x)
    if rows >= TENSOR_CORES_FROM_ROWS and gemm.tensor_cores:  # activations rounded to e4m3 there
        xq, sx = quantize_rows_fp8(x)
        check(y, (xq.double() * sx.double()).to(torch.bfloat16), weight, None)
    else:
        check(y, x, weight, None)


def test_gemlite_launch_tables_follow_the_device_name():
    assert launch_table("NVIDIA H100 80GB HBM3") == "h100"
    assert launch_table("NVIDIA H200") == "h100"
    assert launch_table("NVIDIA L40S") == "l40s" and launch_table("NVIDIA L40") == "l40"
    assert launch_table("NVIDIA GeForce RTX 4090") == "4090"
    assert launch_table("NVIDIA GeForce RTX 3060") is None  # gemlite autotunes it


def test_fused_parts_concatenate_their_outputs():
    parts = [make_weight("awq", n, 128, seed=n).to(torch.device(DEVICE)) for n in (64, 32, 32)]
    fused = concat_outputs(parts)
    assert fused.shape == (128, 128)
    assert torch.equal(
        dequantize(fused, torch.float64), torch.cat([dequantize(p, torch.float64) for p in parts])
    )
    x = torch.randn(4, 128, device=DEVICE)
    check(Int4Gemm(awq_as_gptq(fused), torch.float32, gemv=False)(x), x, fused, None)
    act_order = [make_weight("gptq-act-order", 64, 256, seed=s) for s in (1, 2)]
    with pytest.raises(ValueError, match="act-order permutation"):
        concat_outputs(act_order)


@pytest.mark.parametrize("path", ["cublas", "dequantize"] + (["gemlite"] if GEMLITE else []))
@pytest.mark.parametrize("kind", ["gptq", "fp8"])
def test_quant_linear_runs_each_path_of_the_plan(kind, path):
    plan = QuantPlan(dequantize_at_load=False, fp8=path, int4=path)
    dtype = torch.bfloat16 if path == "gemlite" else torch.float32
    weight = prepare_quantized(make_weight(kind, 64, 128, seed=9).to(torch.device(DEVICE)), plan, dtype)
    assert (weight.gemm is None) == (path == "dequantize")
    x = torch.randn(3, 128, device=DEVICE, dtype=dtype)
    bias = torch.randn(64, device=DEVICE, dtype=dtype)
    check(quant_linear(x, weight, bias, plan=plan), x, weight, bias)
    dense = torch.randn(64, 128, device=DEVICE, dtype=dtype)
    assert torch.equal(quant_linear(x, dense, plan=plan), torch.nn.functional.linear(x, dense))


def test_quant_plan_refuses_unknown_paths():
    with pytest.raises(ValueError, match="fp8 must be one of"):
        QuantPlan(fp8="cutlass")
    with pytest.raises(ValueError, match="int4 must be one of"):
        QuantPlan(int4="triton")
    with pytest.raises(ValueError, match="K-packed"):
        Int4Gemm(make_weight("awq", 64, 128, seed=1), torch.float32, gemv=False)
    with pytest.raises(ValueError, match="takes an fp8 weight"):
        Fp8Gemm(make_weight("gptq", 64, 128, seed=1), torch.float32, gemv=False)


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
