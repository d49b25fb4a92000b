"""oneDNN-packed CPU GEMMs: same numbers as F.linear, clear errors, and the engine's switch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from multilora_studio.kernels.cpu_linear import onednn_packing_available, pack_weight, packed_linear

needs_onednn = pytest.mark.skipif(
    not onednn_packing_available(torch.float32), reason="this torch build has no oneDNN linear packing"
)


@needs_onednn
@pytest.mark.parametrize("rows", [1, 7, 8, 65])
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_linear_matches_f_linear_in_float32(rows, with_bias):
    weight = torch.randn(96, 80, dtype=torch.float64)
    x = torch.randn(rows, 80, dtype=torch.float64)
    bias = torch.randn(96, dtype=torch.float64) if with_bias else None
    expected = F.linear(x, weight, bias)  # float64 reference
    packed = pack_weight(weight.float())
    assert packed.shape == (96, 80)
    got = packed_linear(x.float(), packed, None if bias is None else bias.float())
    assert got.shape == (rows, 96) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), expected, atol=1e-4, rtol=1e-4)


@needs_onednn
def test_packed_weight_is_an_opaque_onednn_tensor_that_plain_ops_refuse():
    weight = torch.randn(64, 128)
    packed = pack_weight(weight)
    assert packed.is_mkldnn and packed.shape == weight.shape
    x = torch.randn(4, 128)
    with pytest.raises((RuntimeError, NotImplementedError)):
        F.linear(x, packed)  # no silent misuse of the blocked layout
    torch.testing.assert_close(packed_linear(x, packed), F.linear(x, weight), atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(not onednn_packing_available(torch.bfloat16), reason="no bfloat16 oneDNN packing")
def test_packed_linear_in_bfloat16_is_close():
    weight = torch.randn(64, 96)
    x = torch.randn(5, 96)
    got = packed_linear(x.bfloat16(), pack_weight(weight.bfloat16()))
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), F.linear(x, weight), atol=0.3, rtol=0.05)


@needs_onednn
def test_wrong_inputs_are_refused_clearly():
    packed = pack_weight(torch.randn(16, 32))
    with pytest.raises(ValueError, match="32"):
        packed_linear(torch.randn(2, 31), packed)
    with pytest.raises(ValueError, match="dtype"):
        packed_linear(torch.randn(2, 32, dtype=torch.float64), packed)
    with pytest.raises(ValueError, match="2-D"):
        pack_weight(torch.randn(2, 3, 4))


def test_unsupported_dtypes_are_not_packed():
    assert not onednn_packing_available(torch.float16)
    assert not onednn_packing_available(torch.int8)
