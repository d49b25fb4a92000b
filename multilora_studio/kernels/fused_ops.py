"""Fused elementwise ops of the decoder layer: residual-add + RMSNorm, RoPE, SiLU- and GELU-and-mul.

On CUDA each op is one Triton launch (a decode step of a 32-layer model would
otherwise spend more time launching small elementwise kernels than reading
weights); on the CPU in float32 one compiled Numba loop (``fused_ops_cpu``); elsewhere the
torch path computes exactly what HF transformers does. ``backend``: "auto", "triton",
"torch" or "numba".
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from . import fused_ops_cpu
from .triton_support import triton_runs_on

__all__ = ["add_rms_norm", "gelu_tanh_and_mul", "norm_add_rms_norm", "rms_norm", "rope_", "silu_and_mul"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _use_triton(x: torch.Tensor, backend: str) -> bool:
    if backend not in ("auto", "triton", "torch", "numba"):
        raise ValueError(f"backend must be 'auto', 'triton', 'torch' or 'numba', got {backend!r}")
    if backend in ("torch", "numba"):
        return False
    if backend == "triton":
        if not triton_runs_on(x.device):
            raise ValueError("the triton backend needs CUDA tensors (or TRITON_INTERPRET=1)")
        return True
    return x.device.type == "cuda"


def _use_numba(x: torch.Tensor, backend: str) -> bool:
    """The compiled CPU kernels: chosen by ``auto`` for float32 CPU tensors, or asked for."""
    if backend == "numba":
        if not fused_ops_cpu.supports(x):
            raise ValueError(
                f"the numba backend needs float32 CPU tensors and Numba, got {x.dtype} on {x.device}"
            )
        return True
    return backend == "auto" and fused_ops_cpu.supports(x)


def _check_rows(name: str, x: torch.Tensor) -> None:
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(
            f"{name} must be 2-D [tokens, features] with a contiguous last dim, got {tuple(x.shape)}"
        )
    if x.dtype not in _DTYPES:
        raise ValueError(f"{name} dtype must be float32, bfloat16 or float16, got {x.dtype}")


@triton.jit
def _add_rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    w_in_ptr,
    out_ptr,
    n_cols,
    x_stride,
    res_stride,
    out_stride,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    NORM_INPUT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    # Arithmetic in float32 with a rounding to the storage dtype wherever HF's bf16/fp16 code
    # rounds (a sum or product of two bf16 values in float32 is exact, so one rounding equals
    # the bf16 operation); this also keeps Triton's interpreter away from bf16 arithmetic.
    x_raw = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
    x32 = x_raw.to(tl.float32)
    if NORM_INPUT:  # x -> rms_norm(x, w_in) first (the Gemma block's output norms)
        x_var = tl.sum(x32 * x32, axis=0) / n_cols
        x_normed = (x32 * tl.rsqrt(x_var + eps)).to(x_raw.dtype).to(tl.float32)
        w_in = tl.load(w_in_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        x_raw = (w_in * x_normed).to(x_raw.dtype)
        x32 = x_raw.to(tl.float32)
    if HAS_RESIDUAL:
        res = tl.load(res_ptr + row * res_stride + cols, mask=mask, other=0.0)
        x_raw = (x32 + res.to(tl.float32)).to(res.dtype)
        tl.store(res_ptr + row * res_stride + cols, x_raw, mask=mask)
        x32 = x_raw.to(tl.float32)
    var = tl.sum(x32 * x32, axis=0) / n_cols
    normed = (x32 * tl.rsqrt(var + eps)).to(x_raw.dtype).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * out_stride + cols, (w * normed).to(x_raw.dtype), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, backend: str = "auto") -> torch.Tensor:
    """RMSNorm of ``x`` [T, H] (HF's LlamaRMSNorm).

    Semantics:
        x32 = x.float()
        return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    """
    _check_rows("x", x)
    if _use_numba(x, backend) and weight.dtype == torch.float32:
        return fused_ops_cpu.rms_norm(x, weight, eps)
    if not _use_triton(x, backend):
        x32 = x.float()
        return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    out = torch.empty_like(x)
    _launch_norm(x, None, weight, out, eps)
    return out


def head_rms_norm_(x: torch.Tensor, weight: torch.Tensor, eps: float, backend: str = "auto") -> torch.Tensor:
    """RMSNorm of every head of ``x`` [T, heads, D] over its D values, in place (Qwen3's q/k norms).

    Semantics:
        x.copy_(rms_norm(x.reshape(T * heads, D), weight, eps).view(T, heads, D))
    """
    if x.dim() != 3 or x.stride(-1) != 1:
        raise ValueError(
            f"x must be [tokens, heads, head_dim] with a contiguous last dim, got {tuple(x.shape)}"
        )
    tokens, heads, dim = x.shape
    if weight.shape != (dim,):
        raise ValueError(f"the head norm's weight must be [{dim}], got {tuple(weight.shape)}")
    if tokens:
        x.copy_(rms_norm(x.reshape(tokens * heads, dim), weight, eps, backend).view(tokens, heads, dim))
    return x


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, backend: str = "auto"
) -> torch.Tensor:
    """``residual += x`` in place, then return RMSNorm of the new residual [T, H].

    Semantics:
        residual.copy_(residual + x)
        return rms_norm(residual, weight, eps)
    """
    _check_rows("x", x)
    _check_rows("residual", residual)
    if x.shape != residual.shape or x.dtype != residual.dtype:
        raise ValueError(
            f"x {tuple(x.shape)} {x.dtype} and residual {tuple(residual.shape)} {residual.dtype} differ"
        )
    if _use_numba(x, backend) and weight.dtype == torch.float32:
        return fused_ops_cpu.add_rms_norm(x, residual, weight, eps)
    if not _use_triton(x, backend):
        residual.copy_(residual + x)
        return rms_norm(residual, weight, eps, backend="torch")
    out = torch.empty_like(x)
    _launch_norm(x, residual, weight, out, eps)
    return out


def norm_add_rms_norm(
    x: torch.Tensor,
    input_weight: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    backend: str = "auto",
) -> torch.Tensor:
    """``residual += rms_norm(x, input_weight)`` in place, then return RMSNorm of the new residual
    [T, H] with ``weight`` (the Gemma block's norm of the attention or MLP output, its residual
    add and the next norm): one launch on CUDA.

    Semantics:
        residual.copy_(residual + rms_norm(x, input_weight, eps))
        return rms_norm(residual, weight, eps)
    """
    _check_rows("x", x)
    _check_rows("residual", residual)
    if x.shape != residual.shape or x.dtype != residual.dtype:
        raise ValueError(
            f"x {tuple(x.shape)} {x.dtype} and residual {tuple(residual.shape)} {residual.dtype} differ"
        )
    if not _use_triton(x, backend):
        return add_rms_norm(rms_norm(x, input_weight, eps, backend), residual, weight, eps, backend)
    out = torch.empty_like(x)
    _launch_norm(x, residual, weight, out, eps, input_weight)
    return out


def _launch_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    out: torch.Tensor,
    eps: float,
    input_weight: torch.Tensor | None = None,
) -> None:
    rows, cols = x.shape
    for w in (weight, input_weight if input_weight is not None else weight):
        if w.shape != (cols,) or w.dtype != x.dtype:
            raise ValueError(f"weight must be [{cols}] of dtype {x.dtype}, got {tuple(w.shape)} {w.dtype}")
    if rows == 0:
        return
    block = triton.next_power_of_2(cols)
    res = residual if residual is not None else x
    _add_rms_norm_kernel[(rows,)](
        x,
        res,
        weight,
        input_weight if input_weight is not None else weight,
        out,
        cols,
        x.stride(0),
        res.stride(0),
        out.stride(0),
        eps,
        HAS_RESIDUAL=residual is not None,
        NORM_INPUT=input_weight is not None,
        BLOCK=block,
        num_warps=min(16, max(1, block // 256)),
    )


@triton.jit
def _rope_kernel(
    x_ptr,
    cs_ptr,
    pos_ptr,
    x_tok_stride,
    x_head_stride,
    cs_stride,
    num_heads,
    HALF: tl.constexpr,
    HEADS: tl.constexpr,
):
    tok = tl.program_id(0)
    pos = tl.load(pos_ptr + tok)
    d = tl.arange(0, HALF)
    h = tl.arange(0, HEADS)
    cos = tl.load(cs_ptr + pos * cs_stride + d)
    sin = tl.load(cs_ptr + pos * cs_stride + HALF + d)
    mask = h[:, None] < num_heads
    base = x_ptr + tok * x_tok_stride + h[:, None] * x_head_stride + d[None, :]
    x1 = tl.load(base, mask=mask, other=0.0)
    x2 = tl.load(base + HALF, mask=mask, other=0.0)
    f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
    tl.store(base, (f1 * cos[None, :] - f2 * sin[None, :]).to(x1.dtype), mask=mask)
    tl.store(base + HALF, (f2 * cos[None, :] + f1 * sin[None, :]).to(x1.dtype), mask=mask)


def rope_(
    x: torch.Tensor, cos_sin: torch.Tensor, positions: torch.Tensor, backend: str = "auto"
) -> torch.Tensor:
    """Rotate ``x`` [T, heads, D] in place by the 'rotate half' RoPE at ``positions`` [T].

    ``cos_sin`` [max_positions, D] float32 holds cos in its first half and sin in its second.

    Semantics:
        cs = cos_sin[positions][:, None]                 # [T, 1, D]
        x1, x2 = x[..., :D // 2].float(), x[..., D // 2:].float()
        c, s = cs[..., :D // 2], cs[..., D // 2:]
        x.copy_(torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1).to(x.dtype))
    """
    if x.dim() != 3 or x.stride(-1) != 1:
        raise ValueError(
            f"x must be [tokens, heads, head_dim] with a contiguous last dim, got {tuple(x.shape)}"
        )
    tokens, heads, dim = x.shape
    if cos_sin.dim() != 2 or cos_sin.shape[1] != dim or cos_sin.dtype != torch.float32:
        raise ValueError(
            f"cos_sin must be float32 [positions, {dim}], got {tuple(cos_sin.shape)} {cos_sin.dtype}"
        )
    if positions.shape != (tokens,):
        raise ValueError(f"positions must be [{tokens}], got {tuple(positions.shape)}")
    if _use_numba(x, backend):
        return fused_ops_cpu.rope_(x, cos_sin, positions)
    if not _use_triton(x, backend):
        half = dim // 2
        cs = cos_sin[positions][:, None, :]  # [T, 1, D]
        cos, sin = cs[..., :half], cs[..., half:]
        x1, x2 = x[..., :half].float(), x[..., half:].float()
        x.copy_(torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype))
        return x
    if dim & (dim - 1) or dim < 8:
        raise ValueError(f"the triton RoPE needs a power-of-two head_dim >= 8, got {dim}")
    if tokens:
        _rope_kernel[(tokens,)](
            x,
            cos_sin,
            positions,
            x.stride(0),
            x.stride(1),
            cos_sin.stride(0),
            heads,
            HALF=dim // 2,
            HEADS=triton.next_power_of_2(heads),
        )
    return x


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, n_cols, x_stride, out_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_stride + n_cols + cols, mask=mask, other=0.0)
    act = (gate / (1.0 + tl.exp(-gate))).to(up.dtype).to(tl.float32)  # rounded like F.silu's output
    tl.store(out_ptr + row * out_stride + cols, (act * up.to(tl.float32)).to(up.dtype), mask=mask)


def _check_gate_up(gate_up: torch.Tensor) -> None:
    _check_rows("gate_up", gate_up)
    if gate_up.shape[1] % 2:
        raise ValueError(f"gate_up must have an even width, got {gate_up.shape[1]}")


def _launch_act_and_mul(kernel: Any, gate_up: torch.Tensor) -> torch.Tensor:
    """act(gate) * up [T, I] of ``gate_up`` [T, 2 I] by ``kernel`` (one program per row and block)."""
    rows, width = gate_up.shape
    half = width // 2
    out = torch.empty((rows, half), dtype=gate_up.dtype, device=gate_up.device)
    if rows:
        block = 1024
        kernel[(rows, triton.cdiv(half, block))](
            gate_up, out, half, gate_up.stride(0), out.stride(0), BLOCK=block
        )
    return out


@triton.jit
def _gelu_tanh_and_mul_kernel(x_ptr, out_ptr, n_cols, x_stride, out_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_stride + n_cols + cols, mask=mask, other=0.0)
    inner = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)  # sqrt(2 / pi) (x + c x^3)
    # tanh from exp2 (no tanh in tl.math): e = exp(-2|u|), tanh(u) = sign(u) (1 - e) / (1 + e)
    e = tl.exp2(tl.abs(inner) * -2.8853900817779268)  # -2 * log2(e)
    t = (1.0 - e) / (1.0 + e)
    tanh = tl.where(inner < 0, -t, t)
    act = (0.5 * gate * (1.0 + tanh)).to(up.dtype).to(tl.float32)  # rounded like F.gelu's output
    tl.store(out_ptr + row * out_stride + cols, (act * up.to(tl.float32)).to(up.dtype), mask=mask)


def gelu_tanh_and_mul(gate_up: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """``gelu_tanh(gate) * up`` [T, I] of ``gate_up`` [T, 2 I] (gate then up; Gemma's MLP), as
    transformers computes it: the activation rounded to the dtype, then the product. One launch
    on CUDA.

    Semantics:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up
    """
    _check_gate_up(gate_up)
    if not _use_triton(gate_up, backend):
        gate, up = gate_up.chunk(2, dim=-1)
        return torch.nn.functional.gelu(gate, approximate="tanh") * up
    return _launch_act_and_mul(_gelu_tanh_and_mul_kernel, gate_up)


def silu_and_mul(gate_up: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up`` [T, 2 I] holding gate then up; returns [T, I].

    Semantics:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up
    """
    _check_gate_up(gate_up)
    # ``auto`` takes torch's SiLU on the CPU: its vectorised exp beats the Numba loop's
    # scalar one (about 1 ms of a 45 ms batch-8 decode step of the embedded model).
    if backend == "numba" and _use_numba(gate_up, backend):
        return fused_ops_cpu.silu_and_mul(gate_up)
    if not _use_triton(gate_up, backend):
        gate, up = gate_up.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up
    return _launch_act_and_mul(_silu_and_mul_kernel, gate_up)
