"""GEMMs in fixed row tiles: the product, and each row the same bits at any row count."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from multilora_studio.kernels.cpu_linear import onednn_packing_available, pack_weight, packed_linear
from multilora_studio.kernels.row_tiles import row_tiled

ROW_COUNTS = [1, 2, 3, 4, 7, 8, 9, 16, 33, 100]


def linears(dtype: torch.dtype, weight: torch.Tensor):
    yield "F.linear", F.linear, weight
    if onednn_packing_available(dtype):
        yield "packed", packed_linear, pack_weight(weight)


@pytest.mark.parametrize("tile", [1, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_each_row_is_the_same_bits_at_every_row_count(dtype, tile):
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(96, 200, generator=gen).to(dtype)
    bias = torch.randn(96, generator=gen).to(dtype)
    x = torch.randn(ROW_COUNTS[-1], 200, generator=gen).to(dtype)
    for name, linear, w in linears(dtype, weight):
        first = row_tiled(linear, tile, x[:1], w, bias)  # [1, 96]
        for rows in ROW_COUNTS:
            # a row-strided input (every other row of a wider batch) as well as a contiguous one
            strided = torch.zeros(2 * rows, 200, dtype=dtype)[::2]
            strided.copy_(x[:rows])
            for source in (x[:rows], strided):
                y = row_tiled(linear, tile, source, w, bias)
                assert y.shape == (rows, 96)
                assert torch.equal(y[0], first[0]), (name, rows)
                expected = F.linear(x[:rows].float(), weight.float(), bias.float())
                atol, rtol = (1e-4, 1e-4) if dtype == torch.float32 else (0.5, 2e-2)
                torch.testing.assert_close(y.float(), expected, atol=atol, rtol=rtol)


def test_no_rows_give_an_empty_result():
    weight = torch.randn(5, 4)
    assert row_tiled(F.linear, 8, torch.empty(0, 4), weight).shape == (0, 5)
