"""Fused decoder-layer ops: Triton (interpreted on the CPU, native on a GPU) and torch paths
against float64 references."""

from __future__ import annotations

import pytest
import torch

from multilora_studio.engine.model.model_spec import RopeSpec
from multilora_studio.engine.model.rope import cos_sin_cache
from multilora_studio.kernels import fused_ops_cpu
from multilora_studio.kernels.fused_ops import (
    add_rms_norm,
    gelu_tanh_and_mul,
    norm_add_rms_norm,
    rms_norm,
    rope_,
    silu_and_mul,
)
from tests.kernels.device import DEVICE

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}
DTYPES = list(TOLERANCE)
BACKENDS = ["torch", "triton", "numba"]  # numba: float32 on the CPU only


@pytest.fixture(autouse=True)
def _on_the_test_device(request):
    """Tensors the test makes land on DEVICE; the Numba backend's tests stay on the CPU, float32."""
    params = getattr(request.node, "callspec", None)
    params = params.params if params is not None else {}
    numba = params.get("backend") == "numba" or "numba" in request.node.name
    if params.get("backend") == "numba":
        if not fused_ops_cpu.AVAILABLE:
            pytest.skip("needs Numba")
        if params.get("dtype", torch.float32) != torch.float32:
            pytest.skip("the numba backend computes float32 only")
    with torch.device("cpu" if numba else DEVICE):
        yield


def close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert torch.isfinite(actual).all()
    error = (actual.double() - expected).norm() / expected.norm()
    assert error < TOLERANCE[dtype], float(error)


def norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return weight.double() * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 64), (7, 96), (33, 576)])
def test_rms_norm_and_add_rms_norm(backend, dtype, shape):
    x = torch.randn(shape, dtype=dtype)
    residual = torch.randn(shape, dtype=dtype)
    weight = (torch.rand(shape[1]) + 0.5).to(dtype)
    close(rms_norm(x, weight, 1e-5, backend=backend), norm_reference(x, weight, 1e-5), dtype)
    expected_residual = residual.double() + x.double()
    expected = norm_reference(expected_residual, weight, 1e-5)
    out = add_rms_norm(x, residual, weight, 1e-5, backend=backend)
    close(residual, expected_residual, dtype)
    close(out, expected, dtype)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 64), (7, 96), (33, 576)])
def test_norm_add_rms_norm(backend, dtype, shape):
    """The Gemma block's output norm, residual add and next norm in one launch, against float64
    and against the separate launches it replaces (within two units in the last place: a native
    compile reduces each kernel's sums in its own order)."""
    x, residual = torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)
    input_weight, weight = ((torch.rand(shape[1]) + 0.5).to(dtype) for _ in range(2))
    expected_residual = residual.double() + norm_reference(x, input_weight, 1e-6)
    composed_residual = residual.clone()
    normed = rms_norm(x, input_weight, 1e-6, backend)
    composed = add_rms_norm(normed, composed_residual, weight, 1e-6, backend)
    out = norm_add_rms_norm(x, input_weight, residual, weight, 1e-6, backend=backend)
    close(residual, expected_residual, dtype)
    close(out, norm_reference(expected_residual, weight, 1e-6), dtype)
    ulps = 2 * torch.finfo(dtype).eps
    torch.testing.assert_close(residual, composed_residual, rtol=ulps, atol=ulps)
    torch.testing.assert_close(out, composed, rtol=ulps, atol=4 * ulps)


def test_triton_norm_matches_torch_path_in_float32():
    x = torch.randn(5, 128)
    weight = torch.rand(128) + 0.5
    assert torch.allclose(
        rms_norm(x, weight, 1e-6, backend="triton"), rms_norm(x, weight, 1e-6, backend="torch"), atol=1e-6
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "heads", "dim"), [(1, 3, 64), (9, 4, 16), (17, 9, 64)])
def test_rope_in_place_on_a_strided_view(backend, dtype, tokens, heads, dim):
    spec = RopeSpec(theta=10000.0, kind="llama3", factor=8.0, original_max_position=64)
    table = cos_sin_cache(spec, dim, 256, torch.empty(0).device)
    fused = torch.randn(tokens, heads * dim + 5, dtype=dtype)  # a view with a row stride like qkv's
    view = fused[:, : heads * dim].view(tokens, heads, dim)
    untouched = fused[:, heads * dim :].clone()
    positions = torch.randint(0, 256, (tokens,))
    x = view.double()
    cs = table.double()[positions][:, None, :]
    half = dim // 2
    expected = torch.cat(
        [
            x[..., :half] * cs[..., :half] - x[..., half:] * cs[..., half:],
            x[..., half:] * cs[..., :half] + x[..., :half] * cs[..., half:],
        ],
        dim=-1,
    )
    rope_(view, table, positions, backend=backend)
    close(view, expected, dtype)
    assert torch.equal(fused[:, heads * dim :], untouched)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "width"), [(1, 64), (5, 3072), (31, 320)])
def test_silu_and_mul(backend, dtype, tokens, width):
    gate_up = torch.randn(tokens, width, dtype=dtype)
    gate, up = gate_up.double().chunk(2, dim=-1)
    expected = gate * torch.sigmoid(gate) * up
    close(silu_and_mul(gate_up, backend=backend), expected, dtype)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "width"), [(1, 64), (5, 3072), (31, 320)])
def test_gelu_tanh_and_mul(backend, dtype, tokens, width):
    gate_up = torch.randn(tokens, width, dtype=dtype) * 3
    gate, up = gate_up.double().chunk(2, dim=-1)
    expected = 0.5 * gate * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (gate + 0.044715 * gate**3))) * up
    out = gelu_tanh_and_mul(gate_up, backend=backend)
    close(out, expected, dtype)
    if dtype != torch.float32:  # the activation rounded to the dtype before the product, as torch
        assert (out.double() - gelu_tanh_and_mul(gate_up, "torch").double()).abs().max() <= 2 * (
            expected.abs().max() * torch.finfo(dtype).eps
        )


def test_bad_inputs_raise_value_errors():
    with pytest.raises(ValueError, match="2-D"):
        rms_norm(torch.randn(2, 3, 4), torch.ones(4), 1e-5)
    with pytest.raises(ValueError, match="weight must be"):
        rms_norm(torch.randn(2, 4), torch.ones(5), 1e-5, backend="triton")
    with pytest.raises(ValueError, match="differ"):
        add_rms_norm(torch.randn(2, 4), torch.randn(3, 4), torch.ones(4), 1e-5)
    with pytest.raises(ValueError, match="even width"):
        silu_and_mul(torch.randn(2, 5))
    with pytest.raises(ValueError, match="positions"):
        rope_(torch.randn(2, 1, 8), torch.randn(10, 8), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="backend"):
        silu_and_mul(torch.randn(2, 4), backend="cuda")


@pytest.mark.skipif(not fused_ops_cpu.AVAILABLE, reason="needs Numba")
def test_numba_backend_checks_what_it_cannot_read_safely():
    x = torch.randn(3, 8)
    with pytest.raises(ValueError, match="weight must be"):
        rms_norm(x, torch.ones(7), 1e-5, backend="numba")
    with pytest.raises(ValueError, match="weight must be"):
        add_rms_norm(x, torch.randn(3, 8), torch.ones(9), 1e-5, backend="numba")
    table = torch.randn(16, 8)
    q = torch.randn(2, 1, 8)
    before = q.clone()
    for bad in ([3, 16], [-1, 2]):
        with pytest.raises(ValueError, match="positions must lie"):
            rope_(q, table, torch.tensor(bad), backend="numba")
    assert torch.equal(q, before)
    with pytest.raises(ValueError, match="float32 CPU tensors"):
        silu_and_mul(torch.randn(2, 4, dtype=torch.bfloat16), backend="numba")


@pytest.mark.skipif(not fused_ops_cpu.AVAILABLE, reason="needs Numba")
def test_auto_on_cpu_float32_equals_numba():
    x, weight = torch.randn(5, 64), torch.rand(64) + 0.5
    assert torch.equal(rms_norm(x, weight, 1e-6), rms_norm(x, weight, 1e-6, backend="numba"))
    torch.testing.assert_close(
        rms_norm(x, weight, 1e-6), rms_norm(x, weight, 1e-6, backend="torch"), rtol=1e-6, atol=1e-6
    )
