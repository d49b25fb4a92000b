"""Round-to-nearest quantization of a float weight into the stored layouts (``kernels/quant_weight``).

Used at load for ``EngineConfig.quantization`` on a float base (FP8 per channel on any base;
AWQ / GPTQ 4-bit only on ``random:`` shapes, for benchmarks: real 4-bit checkpoints carry
calibrated weights), to repack GPTQ act-order checkpoints into group-contiguous rows, and by
the tests to write checkpoints in each format. Layouts, as the formats document them:

* AutoAWQ ``WQLinear_GEMM.from_linear``: ``qweight[k, c] |= q[k, 8 c + order[i]] << 4 i`` with
  ``order = [0, 2, 4, 6, 1, 3, 5, 7]``; qzeros packed the same way; scales [K / G, N] fp16.
* AutoGPTQ ``QuantLinear.pack``: ``qweight[r, n] |= q[8 r + i, n] << 4 i`` (rows along K);
  ``qzeros[g, c] |= (z[g, 8 c + i] - 1) << 4 i`` (the gptq format stores zeros minus one;
  gptq_v2 stores them as they are); scales [K / G, N] fp16; ``g_idx[k]`` = row k's group.
"""

from __future__ import annotations

import torch

from multilora_studio.kernels.quant_weight import GROUP_SIZE, QuantizedWeight, unpack_awq, unpack_gptq_rows

FP8_MAX = 448.0  # the largest float8_e4m3fn value
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ: nibble i holds column order[i] of its eight
_SHIFTS = torch.arange(8, dtype=torch.int64) * 4


def pack_sequential(values: torch.Tensor) -> torch.Tensor:
    """[R, 8 C] values 0..15 -> [R, C] int32, column 8 c + i in nibble i of word c."""
    rows = values.shape[0]
    words = (values.to(torch.int64).view(rows, -1, 8) << _SHIFTS.to(values.device)).sum(-1)  # [R, C]
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # the same 32 bits


def pack_awq(values: torch.Tensor) -> torch.Tensor:
    """[R, 8 C] values 0..15 -> [R, C] int32 in AutoAWQ's order (nibble i holds column order[i])."""
    order = torch.tensor(AWQ_ORDER, device=values.device)
    return pack_sequential(values.view(values.shape[0], -1, 8)[:, :, order].reshape(values.shape))


def pack_gptq_rows(values: torch.Tensor) -> torch.Tensor:
    """[K, N] values 0..15 -> [K / 8, N] int32, row 8 r + i in nibble i of row r."""
    k, n = values.shape
    return pack_sequential(values.t().contiguous()).t().contiguous().view(k // 8, n)


def quantize_fp8(weight: torch.Tensor) -> QuantizedWeight:
    """[N, K] float weight -> FP8 e4m3 with one float32 scale per output channel (absmax / 448)."""
    w = weight.float()
    scales = (w.abs().amax(dim=1) / FP8_MAX).clamp(min=torch.finfo(torch.float32).tiny)  # [N]
    q = (w / scales.unsqueeze(1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)  # [N, K]
    return QuantizedWeight("fp8", (weight.shape[0], weight.shape[1]), q, scales)


def int4_groups(
    weight: torch.Tensor, group_size: int = GROUP_SIZE, min_zero: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric round-to-nearest 4-bit quantization of [N, K] in groups of ``group_size`` input
    rows: (q [K, N] 0..15, zeros [K / G, N] ``min_zero``..15, scales [K / G, N] float16), with
    ``W[n, k] ~ (q[k, n] - zeros[g, n]) * scales[g, n]``."""
    n, k = weight.shape
    w = weight.double().t().reshape(k // group_size, group_size, n)  # [G, group, N]
    low = w.amin(dim=1).clamp(max=0)
    high = w.amax(dim=1).clamp(min=0)
    scales = ((high - low) / 15).clamp(min=1e-8).half()  # [G, N], as checkpoints store them
    s = scales.double()
    zeros = torch.round(-low / s).clamp(min_zero, 15)  # [G, N]
    q = torch.clamp(torch.round(w / s.unsqueeze(1)) + zeros.unsqueeze(1), 0, 15)  # [G, group, N]
    return q.reshape(k, n).to(torch.int32), zeros.to(torch.int32), scales


def quantize_awq(weight: torch.Tensor, group_size: int = GROUP_SIZE) -> QuantizedWeight:
    """[N, K] float weight -> AWQ's GEMM layout (round to nearest, no calibration)."""
    q, zeros, scales = int4_groups(weight, group_size)
    n, k = weight.shape
    return QuantizedWeight("awq", (n, k), pack_awq(q), scales, pack_awq(zeros), group_size=group_size)


def quantize_gptq(
    weight: torch.Tensor, group_size: int = GROUP_SIZE, zero_offset: int = 1
) -> QuantizedWeight:
    """[N, K] float weight -> GPTQ's layout without act-order (round to nearest); the gptq format
    (``zero_offset`` 1) cannot store a zero point of 0, so zeros start at 1 there."""
    q, zeros, scales = int4_groups(weight, group_size, min_zero=zero_offset)
    n, k = weight.shape
    return QuantizedWeight(
        "gptq", (n, k), pack_gptq_rows(q), scales, pack_sequential(zeros - zero_offset),
        zero_offset=zero_offset, group_size=group_size,
    )  # fmt: skip


def group_contiguous(weight: QuantizedWeight, g_idx: torch.Tensor) -> QuantizedWeight:
    """A GPTQ act-order weight as checkpoints store it (``qweight`` rows in input-feature order,
    ``g_idx`` [K] each row's group) -> rows repacked so that each group is ``group_size``
    consecutive rows, with ``perm`` the input feature of each stored row. ValueError when a
    group does not hold exactly ``group_size`` rows."""
    k = weight.in_features
    if tuple(g_idx.shape) != (k,):
        raise ValueError(f"g_idx must have shape ({k},), got {tuple(g_idx.shape)}")
    g = g_idx.to(torch.int64)
    perm = torch.argsort(g, stable=True)  # [K] stored row -> input feature
    expected = torch.arange(k, device=g.device) // weight.group_size
    if not torch.equal(g[perm], expected):
        raise ValueError(
            f"g_idx does not give every group exactly {weight.group_size} rows; this GPTQ layout "
            "is not supported"
        )
    if torch.equal(perm, torch.arange(k, device=g.device)):
        return weight  # act-order in name only: groups in row order
    rows = unpack_gptq_rows(weight.qweight)[perm]  # [K, N] in stored (group) order
    return QuantizedWeight(
        "gptq", weight.shape, pack_gptq_rows(rows), weight.scales, weight.qzeros, perm,
        weight.zero_offset, weight.group_size,
    )  # fmt: skip


def awq_as_gptq(weight: QuantizedWeight) -> QuantizedWeight:
    """An AWQ weight repacked into GPTQ's K-packed layout (``zero_offset`` 0): the same 4-bit
    values, zero points and scales, so it dequantizes to the same matrix bit for bit."""
    if weight.kind != "awq" or weight.qzeros is None:
        raise ValueError(f"awq_as_gptq takes an awq weight, got {weight.kind}")
    q = unpack_awq(weight.qweight)  # [K, N]
    zeros = unpack_awq(weight.qzeros)  # [K / G, N]
    return QuantizedWeight(
        "gptq", weight.shape, pack_gptq_rows(q), weight.scales, pack_sequential(zeros),
        None, 0, weight.group_size,
    )  # fmt: skip
