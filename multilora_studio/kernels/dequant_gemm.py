"""The dequantize-GEMM: ``x @ W^T`` over a quantized weight, dequantized tile by tile in registers.

One kernel for the three stored layouts of ``quant_weight`` (AWQ and GPTQ 4-bit in groups of
128, FP8 e4m3 with per-channel scales): each program owns a [BM, BN] output tile and walks K
in BK steps; it loads the packed words of its [BK, BN] weight tile (an int32 holds eight
4-bit values: AWQ along N in its interleaved order, GPTQ along K in order; FP8 one byte a
value), the group's scales and zeros (BK divides the group size, so one group per K step),
dequantizes into the activation dtype and multiplies with ``tl.dot`` in float32. The weight
crosses memory once, at 4 (or 8) bits a value: decode steps, which read every weight once,
are bound by those bytes. GPTQ act-order weights (``perm``) gather x's columns in the
permuted order while loading the x tile, so the weight stays in its group-contiguous order.
FP8's per-channel scale multiplies the float32 accumulator once at the end. Decode-sized
GEMMs (a few rows) split K over several programs (``split_k``), each writing a float32 partial
that one sum adds up: their output tiles alone would occupy a fraction of the GPU's SMs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .quant_weight import QuantizedWeight
from .triton_support import interpreting

__all__ = ["DECODE_PROGRAMS", "TileConfig", "dequant_gemm", "split_k", "tile_config"]

LAYOUTS = {"awq": 0, "gptq": 1, "fp8": 2}


@triton.jit
def _int4_tile(
    qw_ptr, zeros_ptr, scales_ptr, k0, n0, group, N, LAYOUT: tl.constexpr, ZERO_OFFSET,
    BK: tl.constexpr, BN: tl.constexpr, GATHER: tl.constexpr,
):  # fmt: skip
    """The [BK, BN] float32 weight tile (rows k0.., columns n0..) of a 4-bit layout in one group.
    Words packed along N (AWQ's values, both layouts' zeros) are either loaded as they lie and
    spread out in registers by ``tl.interleave`` or, with ``GATHER``, loaded once per column
    (eight lanes read one word); GPTQ's values, packed along K, are spread by a broadcast."""
    offs_n = n0 + tl.arange(0, BN)  # [BN]
    n_mask = offs_n < N
    packed_n = N // 8
    offs_c = n0 // 8 + tl.arange(0, BN // 8)  # [BN / 8] words of 8 columns
    if GATHER:
        zero_words = tl.load(zeros_ptr + group * packed_n + offs_n // 8, mask=n_mask, other=0)  # [BN]
    else:
        zero_words = tl.load(zeros_ptr + group * packed_n + offs_c, mask=offs_c < packed_n, other=0)
        zero_words = tl.interleave(zero_words, zero_words)
        zero_words = tl.interleave(zero_words, zero_words)
        zero_words = tl.interleave(zero_words, zero_words)  # [BN]: column n's word
    j = tl.arange(0, BN) % 8
    if LAYOUT == 0:  # awq: qweight [K, N / 8]; column 8 c + j in nibble (j odd) * 4 + j // 2
        offs_k = k0 + tl.arange(0, BK)
        if GATHER:
            words = tl.load(
                qw_ptr + offs_k[:, None] * packed_n + (offs_n // 8)[None, :], mask=n_mask[None, :], other=0
            )  # [BK, BN]
        else:
            words = tl.load(
                qw_ptr + offs_k[:, None] * packed_n + offs_c[None, :],
                mask=(offs_c < packed_n)[None, :],
                other=0,
            )  # [BK, BN / 8]
            words = tl.interleave(words, words)
            words = tl.interleave(words, words)
            words = tl.interleave(words, words)  # [BK, BN]
        shift = ((j & 1) * 4 + (j >> 1)) * 4  # [BN]
        q = (words >> shift[None, :]) & 0xF
        z = (zero_words >> shift) & 0xF  # [BN]
    else:  # gptq: qweight [K / 8, N]; row 8 r + i in nibble i of row r; zeros along N in order
        offs_r = k0 // 8 + tl.arange(0, BK // 8)
        words = tl.load(qw_ptr + offs_r[:, None] * N + offs_n[None, :], mask=n_mask[None, :], other=0)
        words = tl.reshape(tl.broadcast_to(words[:, None, :], (BK // 8, 8, BN)), (BK, BN))  # row k's word
        q = (words >> ((tl.arange(0, BK) % 8) * 4)[:, None]) & 0xF
        z = ((zero_words >> (j * 4)) & 0xF) + ZERO_OFFSET
    s = tl.load(scales_ptr + group * N + offs_n, mask=n_mask, other=0.0).to(tl.float32)  # [BN]
    # q as a float without an int-to-float conversion (a slow instruction, once per weight): the
    # bits of 2^23 with q in the low mantissa bits are 2^23 + q exactly; z's 2^23 + z comes off
    q_plus = (q | 0x4B000000).to(tl.float32, bitcast=True)  # [BK, BN] 2^23 + q
    return (q_plus - (z.to(tl.float32) + 8388608.0)[None, :]) * s[None, :]


@triton.jit
def _e4m3_values(b):
    """float32 values of float8_e4m3fn bytes (int32 0..255), decoded from their bits (exact; no
    FP8 type needed, so Ampere and the interpreter run it): sign, 4 exponent bits (bias 7), 3
    mantissa bits into float32's fields. Exponent 0 is subnormal, m * 2^-9 = 2^-6 (1 + m / 8) -
    2^-6: the normal bits with float32 exponent 2^-6, less the implicit leading 2^-6 (integer and
    float operations only, no int-to-float conversion)."""
    sign = b >> 7
    exponent = (b >> 3) & 0xF
    subnormal = exponent == 0
    field = tl.where(subnormal, 121, exponent + 120)  # float32's biased exponent: 2^(e - 7)
    value = ((sign << 31) | (field << 23) | ((b & 0x7) << 20)).to(tl.float32, bitcast=True)
    implicit = ((sign << 31) | (121 << 23)).to(tl.float32, bitcast=True)  # +-2^-6
    return tl.where(subnormal, value - implicit, value)


# the step's row count (and the split that follows from it) never asks for a new compile
@triton.jit(do_not_specialize=["M", "stride_xm", "k_per_split"])
def _dequant_gemm_kernel(
    x_ptr,
    qw_ptr,
    scales_ptr,
    zeros_ptr,
    perm_ptr,
    bias_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_ym,
    k_per_split,
    ZERO_OFFSET,
    GROUP: tl.constexpr,
    LAYOUT: tl.constexpr,
    HAS_PERM: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    GATHER: tl.constexpr,
    NATIVE_FP8: tl.constexpr,
    GEMV: tl.constexpr,
    FP32_OPERANDS: tl.constexpr,
    FP32_PRECISION: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    split = tl.program_id(2)  # split-K: this program's share of K, its partial at y + split * M * N
    offs_m = pid_m * BM + tl.arange(0, BM)  # [BM]
    offs_n = pid_n * BN + tl.arange(0, BN)  # [BN]
    m_mask = offs_m < M
    n_mask = offs_n < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    products = tl.zeros((BK, BN), dtype=tl.float32)  # GEMV (BM == 1): x_k * w_kn, summed over K at the end
    k_start = split * k_per_split
    k_end = tl.minimum(K, k_start + k_per_split)
    for k0 in range(k_start, k_end, BK):
        offs_k = k0 + tl.arange(0, BK)  # [BK]
        k_mask = offs_k < K
        if HAS_PERM:  # noqa: SIM108 - act-order: stored row j multiplies input feature perm[j]
            x_cols = tl.load(perm_ptr + offs_k, mask=k_mask, other=0)
        else:
            x_cols = offs_k
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + x_cols[None, :],
            mask=m_mask[:, None] & k_mask[None, :],
            other=0.0,
        )  # [BM, BK]
        if LAYOUT == 2:  # fp8: qweight [N, K], its bytes read along K (contiguous), then transposed
            w_bytes = tl.load(
                qw_ptr + offs_n[:, None] * K + offs_k[None, :],
                mask=n_mask[:, None] & k_mask[None, :],
                other=0,
            )  # [BN, BK] uint8
            if NATIVE_FP8:  # the device converts e4m3 itself (compute capability >= 8.9)
                w = tl.trans(w_bytes.to(tl.float8e4nv, bitcast=True).to(tl.float32))  # [BK, BN]
            else:
                w = tl.trans(_e4m3_values(w_bytes.to(tl.int32)))  # [BK, BN]
        else:
            w = _int4_tile(
                qw_ptr, zeros_ptr, scales_ptr, k0, pid_n * BN, k0 // GROUP, N, LAYOUT, ZERO_OFFSET,
                BK, BN, GATHER,
            )  # fmt: skip
        if GEMV:  # one row, no tensor-core tile: products in registers, one reduction after the loop
            products += tl.trans(x).to(tl.float32) * w  # [BK, 1] * [BK, BN]
        elif FP32_OPERANDS:  # no rounding of w to x's dtype: a tf32 (or float32) product
            acc += tl.dot(x.to(tl.float32), w, input_precision=FP32_PRECISION)
        elif UPCAST:  # the interpreter multiplies bf16 tiles as raw bits: float32 tiles of bf16 values
            acc += tl.dot(x.to(tl.float32), w.to(x.dtype).to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(x, w.to(x.dtype), input_precision=DOT_PRECISION)
    if GEMV:
        acc += tl.sum(products, axis=0)[None, :]
    if LAYOUT == 2:
        acc *= tl.load(scales_ptr + offs_n, mask=n_mask, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(
        y_ptr + split * M * N + offs_m[:, None] * stride_ym + offs_n[None, :],
        acc.to(y_ptr.dtype.element_ty),
        mask=m_mask[:, None] & n_mask[None, :],
    )


DECODE_PROGRAMS = 264  # split-K until a decode GEMM has about this many programs (2 per H200 SM)


@dataclass(frozen=True)
class TileConfig:
    """How one dequantize-GEMM is launched: a [bm, bn] output tile per program, K in bk steps
    (bk divides the 4-bit group size, 128), ``warps`` and software-pipeline ``stages``; ``splits``
    parts of K (None: ``split_k``'s choice); ``gather`` loads words packed along N once per
    column instead of interleaving them in registers; ``native_fp8`` converts e4m3 bytes with
    the device's own instructions (compute capability >= 8.9) instead of decoding their bits;
    ``gemv`` (bm == 1: a program per row) multiplies without tensor-core tiles, summing each
    column's products over K in registers; ``fp32_operands`` gives the tensor cores float32
    weight tiles (tf32 products) instead of tiles rounded to x's dtype (a slow conversion per
    weight, which decode-sized GEMMs feel)."""

    bm: int
    bn: int
    bk: int
    warps: int
    stages: int = 3
    splits: int | None = None
    gather: bool = False
    native_fp8: bool = False
    gemv: bool = False
    fp32_operands: bool = False

    def __post_init__(self) -> None:
        if self.gemv != (self.bm == 1):
            raise ValueError(f"a GEMV launch has one row a program (bm == 1), got {self}")


def tile_config(rows: int) -> TileConfig:
    """The launch for ``rows`` rows of x: 64-column tiles for decode (rows <= 32: an AWQ row of a
    tile is 32 contiguous bytes), wider ones for prefill."""
    if rows <= 16:
        return TileConfig(16, 64, 128, 4)
    if rows <= 32:
        return TileConfig(32, 64, 64, 4)
    return TileConfig(64, 128, 64, 8)


def split_k(rows: int, n_blocks: int, k_blocks: int) -> int:
    """How many parts K is split into: decode-sized GEMMs (rows <= 32), whose output tiles alone
    would leave most of the GPU idle, until about ``DECODE_PROGRAMS`` programs; 1 otherwise."""
    if rows > 32:
        return 1
    return max(1, min(k_blocks, DECODE_PROGRAMS // max(1, n_blocks)))


def dequant_gemm(
    x: torch.Tensor,
    weight: QuantizedWeight,
    bias: torch.Tensor | None = None,
    config: TileConfig | None = None,
) -> torch.Tensor:
    """``x`` [T, K] times a quantized weight [N, K] -> [T, N] in x's dtype (the Triton kernel),
    launched as ``config`` says (``tile_config``'s choice by default).

    Semantics::

        W = quant_weight.dequantize(weight, torch.float64)          # [N, K]
        y = (x.double() @ W.T + (0 if bias is None else bias)).to(x.dtype)

    with float32 accumulation; each weight value is rounded once to x's dtype before the
    product, or to tf32 (``fp32_operands``), or not at all (``gemv``); FP8's per-channel scale
    multiplies the float32 sum.
    """
    if x.dim() != 2 or x.shape[1] != weight.in_features:
        raise ValueError(f"x must be [T, {weight.in_features}], got {tuple(x.shape)}")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"x must be float32, bfloat16 or float16, got {x.dtype}")
    if x.device != weight.device:
        raise ValueError(f"x is on {x.device}, the weight on {weight.device}")
    if x.stride(1) != 1:
        raise ValueError("x's rows must be contiguous")
    n, k = weight.shape
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"bias must be [{n}], got {tuple(bias.shape)}")
    rows = x.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows == 0:
        return y
    config = config or tile_config(rows)
    bm, bn, bk = config.bm, config.bn, config.bk
    k_blocks = triton.cdiv(k, bk)
    splits = config.splits or split_k(rows, triton.cdiv(n, bn), k_blocks)
    k_per_split = triton.cdiv(k_blocks, min(splits, k_blocks)) * bk
    splits = triton.cdiv(k, k_per_split)  # no empty part
    # [splits, T, N] float32 partials, summed below; or the output itself
    out = y if splits == 1 else torch.empty((splits, rows, n), dtype=torch.float32, device=x.device)
    # fp8 bytes as uint8: the kernel decodes them (_e4m3_values)
    qweight = weight.qweight.view(torch.uint8) if weight.kind == "fp8" else weight.qweight
    zeros = weight.qzeros if weight.qzeros is not None else qweight
    perm = weight.perm if weight.perm is not None else qweight
    grid = (triton.cdiv(n, bn), triton.cdiv(rows, bm), splits)
    with_bias = bias is not None and splits == 1
    _dequant_gemm_kernel[grid](
        x, qweight, weight.scales, zeros, perm, bias if with_bias else weight.scales, out,
        rows, n, k, x.stride(0), n if splits > 1 else y.stride(0), k_per_split, weight.zero_offset,
        GROUP=weight.group_size, LAYOUT=LAYOUTS[weight.kind], HAS_PERM=weight.perm is not None,
        HAS_BIAS=with_bias, BM=bm, BN=bn, BK=bk,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        UPCAST=x.dtype == torch.bfloat16 and interpreting(), GATHER=config.gather,
        NATIVE_FP8=config.native_fp8, GEMV=config.gemv, FP32_OPERANDS=config.fp32_operands,
        FP32_PRECISION="ieee" if x.dtype == torch.float32 or interpreting() else "tf32",
        num_warps=config.warps, num_stages=config.stages,
    )  # fmt: skip
    if splits == 1:
        return y
    total = out.sum(0)  # [T, N] float32
    if bias is not None:
        total += bias.float()
    return y.copy_(total)
