"""A quantized base weight as the checkpoints store it (FP8 e4m3, AWQ and GPTQ 4-bit), and its
dequantization: the reference every quantized GEMM is tested against.

Storage layouts (``QuantizedWeight``), for a projection of ``N`` output and ``K`` input features:

* ``fp8``: ``qweight`` [N, K] float8_e4m3fn, ``scales`` [N] float32 (a per-tensor scale is
  stored as N equal entries); ``W[n, k] = qweight[n, k] * scales[n]`` (compressed-tensors'
  ``float-quantized`` format and vLLM's ``fp8`` checkpoints).
* ``awq`` (AutoAWQ's GEMM layout, ``version: gemm``): ``qweight`` [K, N / 8] int32, eight
  4-bit values of one input row packed along N: the value of column ``8 c + j`` sits in the
  nibble ``AWQ_NIBBLE[j]`` of word c (AutoAWQ packs in the order [0, 2, 4, 6, 1, 3, 5, 7]);
  ``qzeros`` [K / G, N / 8] int32 packed the same way; ``scales`` [K / G, N];
  ``W[n, k] = (q[k, n] - z[k // G, n]) * scales[k // G, n]``.
* ``gptq`` (AutoGPTQ / GPTQModel, ``checkpoint_format`` gptq or gptq_v2): ``qweight`` [K / 8, N]
  int32, eight input rows packed along K in order (row ``8 r + i`` in nibble i of word r);
  ``qzeros`` [K / G, N / 8] int32 packed along N in order; ``scales`` [K / G, N];
  ``W[n, k] = (q[k, n] - (z[g, n] + zero_offset)) * scales[g, n]`` with g the group of row k
  (``zero_offset`` 1 for the gptq format, which stores each zero minus one; 0 for gptq_v2).
  Act-order (``desc_act``) checkpoints are stored here with their input rows permuted so that
  every group is G consecutive rows: stored row j is input feature ``perm[j]``, so
  ``W[:, perm[j]]`` is dequantized from stored row j (``perm`` [K] int64; None without
  act-order).

Semantics of every quantized GEMM: ``x @ dequantize(weight, float64).T`` (+ bias).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

__all__ = [
    "AWQ_NIBBLE",
    "FORMATS",
    "GROUP_SIZE",
    "INT4_FORMATS",
    "QuantizedWeight",
    "Weight",
    "concat_outputs",
    "dequantize",
    "unpack_awq",
    "unpack_gptq_rows",
    "unpack_sequential",
]

FORMATS = ("fp8", "awq", "gptq")
INT4_FORMATS = ("awq", "gptq")
GROUP_SIZE = 128  # the one 4-bit group size served (the Hub's -AWQ and -GPTQ-Int4 repositories)
# AWQ: the nibble holding column j (0..7) of each packed word; the inverse of AutoAWQ's pack
# order [0, 2, 4, 6, 1, 3, 5, 7] (nibble i holds column order[i])
AWQ_NIBBLE = (0, 4, 1, 5, 2, 6, 3, 7)
_SHIFTS = torch.arange(8, dtype=torch.int32) * 4  # nibble i sits at bits 4 i .. 4 i + 3


@dataclass
class QuantizedWeight:
    """One quantized projection weight [N, K] (module docstring for each format's layout)."""

    kind: str  # "fp8", "awq" or "gptq"
    shape: tuple[int, int]  # (N, K) of the weight it stands for
    qweight: torch.Tensor
    scales: torch.Tensor
    qzeros: torch.Tensor | None = None  # int4 formats
    perm: torch.Tensor | None = None  # gptq act-order: [K] int64, stored row -> input feature
    zero_offset: int = 0  # gptq: 1 (zeros stored minus one), else 0
    group_size: int = GROUP_SIZE
    # the device kernels that multiply it, attached at load (``quant_linear.prepare_quantized``):
    # (x [T, K], bias) -> [T, N]; None: a dense copy per call
    gemm: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor] | None = field(
        default=None, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if self.kind not in FORMATS:
            raise ValueError(f"quantized weight kind must be one of {FORMATS}, got {self.kind!r}")
        n, k = self.shape
        expected = {
            "fp8": (n, k),
            "awq": (k, n // 8),
            "gptq": (k // 8, n),
        }[self.kind]
        if tuple(self.qweight.shape) != expected:
            raise ValueError(
                f"{self.kind} qweight has shape {tuple(self.qweight.shape)}, "
                f"a [{n}, {k}] weight needs {expected}"
            )
        if self.kind == "fp8":
            if self.qweight.dtype != torch.float8_e4m3fn or tuple(self.scales.shape) != (n,):
                raise ValueError("an fp8 weight is float8_e4m3fn [N, K] with float32 scales [N]")
            return
        if n % 8 or k % self.group_size:
            raise ValueError(f"a 4-bit weight needs N % 8 == 0 and K % {self.group_size} == 0, got {(n, k)}")
        groups = k // self.group_size
        if self.qweight.dtype != torch.int32 or self.qzeros is None or self.qzeros.dtype != torch.int32:
            raise ValueError(f"{self.kind} qweight and qzeros must be int32")
        if tuple(self.scales.shape) != (groups, n) or tuple(self.qzeros.shape) != (groups, n // 8):
            raise ValueError(
                f"{self.kind} scales {tuple(self.scales.shape)} / qzeros {tuple(self.qzeros.shape)} do not "
                f"fit a [{n}, {k}] weight in groups of {self.group_size}"
            )
        if self.perm is not None and tuple(self.perm.shape) != (k,):
            raise ValueError(f"perm must have shape ({k},)")

    @property
    def out_features(self) -> int:
        return self.shape[0]

    @property
    def in_features(self) -> int:
        return self.shape[1]

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    @property
    def nbytes(self) -> int:
        """The device bytes the stored weight takes (what a step reads)."""
        parts = (self.qweight, self.scales, self.qzeros, self.perm)
        return sum(t.numel() * t.element_size() for t in parts if t is not None)

    def to(self, device: torch.device) -> QuantizedWeight:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return QuantizedWeight(
            self.kind, self.shape, self.qweight.to(device), self.scales.to(device), move(self.qzeros),
            move(self.perm), self.zero_offset, self.group_size,
        )  # fmt: skip


Weight = torch.Tensor | QuantizedWeight  # what a projection of the base model holds


def unpack_sequential(packed: torch.Tensor) -> torch.Tensor:
    """[R, C] int32 of eight nibbles each -> [R, C * 8] int32 values 0..15, nibble i of word c at
    column 8 c + i."""
    values = (packed.unsqueeze(-1) >> _SHIFTS.to(packed.device)) & 0xF  # [R, C, 8]
    return values.reshape(packed.shape[0], -1)


def unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    """[R, C] int32 in AWQ's interleaved order -> [R, C * 8] values: column 8 c + j from nibble
    ``AWQ_NIBBLE[j]`` of word c."""
    nibbles = unpack_sequential(packed).view(packed.shape[0], -1, 8)  # [R, C, 8] by nibble
    order = torch.tensor(AWQ_NIBBLE, device=packed.device)
    return nibbles[:, :, order].reshape(packed.shape[0], -1)


def unpack_gptq_rows(packed: torch.Tensor) -> torch.Tensor:
    """[K / 8, N] int32 packed along K -> [K, N] values (row 8 r + i from nibble i of row r)."""
    values = (packed.unsqueeze(1) >> _SHIFTS.to(packed.device).view(1, 8, 1)) & 0xF  # [K / 8, 8, N]
    return values.reshape(-1, packed.shape[1])


def dequantize(weight: QuantizedWeight, dtype: torch.dtype) -> torch.Tensor:
    """The weight [N, K] in ``dtype``, computed in float64 (exact for every format: a 4-bit
    value times a 16-bit scale, an e4m3 value times a float32 scale) and rounded once."""
    k = weight.in_features
    if weight.kind == "fp8":
        return (weight.qweight.double() * weight.scales.double().unsqueeze(1)).to(dtype)
    assert weight.qzeros is not None
    group = weight.group_size
    if weight.kind == "awq":
        q = unpack_awq(weight.qweight)  # [K, N]
        zeros = unpack_awq(weight.qzeros)  # [K / G, N]
    else:
        q = unpack_gptq_rows(weight.qweight)  # [K, N], stored row order
        zeros = unpack_sequential(weight.qzeros) + weight.zero_offset  # [K / G, N]
    rows = torch.arange(k, device=q.device) // group  # stored row -> its group
    w = (q - zeros[rows]).double() * weight.scales.double()[rows]  # [K, N], stored row order
    if weight.perm is not None:
        w = torch.empty_like(w).index_copy_(0, weight.perm, w)  # input feature order
    return w.t().to(dtype).contiguous()


def concat_outputs(parts: list[QuantizedWeight]) -> QuantizedWeight:
    """One weight whose outputs are the parts' outputs in order (q, k, v into qkv): the parts must
    share kind, K, group size, zero offset and act-order permutation."""
    first = parts[0]
    if len(parts) == 1:
        return first
    for part in parts[1:]:
        same_perm = (part.perm is None and first.perm is None) or (
            part.perm is not None and first.perm is not None and torch.equal(part.perm, first.perm)
        )
        if (part.kind, part.in_features, part.group_size, part.zero_offset) != (
            first.kind, first.in_features, first.group_size, first.zero_offset,
        ) or not same_perm:  # fmt: skip
            raise ValueError(
                "the projections fused into one GEMM (q/k/v, gate/up) must be quantized alike "
                "(format, group size, zero points and act-order permutation)"
            )
    n = sum(part.out_features for part in parts)
    column_dim = 0 if first.kind == "fp8" else 1  # fp8 [N, K]; awq [K, N / 8]; gptq [K / 8, N]
    zeros = None if first.qzeros is None else torch.cat([p.qzeros for p in parts if p.qzeros is not None], 1)
    scales_dim = 0 if first.kind == "fp8" else 1
    return QuantizedWeight(
        first.kind,
        (n, first.in_features),
        torch.cat([p.qweight for p in parts], column_dim),
        torch.cat([p.scales for p in parts], scales_dim),
        zeros,
        first.perm,
        first.zero_offset,
        first.group_size,
    )
