"""Multi-LoRA shrink / expand: the LoRA term of a projection for a batch that mixes adapters.

Every LoRA-targeted linear computes ``y = x W^T + scale[t] * (x A^T) B^T`` where the base
GEMM is shared by all rows and the LoRA term uses, for each token, the adapter held in that
token's GPU slot (the adapter's alpha / r already folded into B) times the token's adapter
strength ``scale[t]`` (``LoRABatch.token_scales``, 1.0 unless the request asks otherwise;
the same adapter at several strengths shares one slot). The LoRA term runs as two launches
per projection, whatever the mix of adapters (SGMV/BGMV style):

* shrink:  ``buf[s, t, :] = x[t] @ lora_a[slot[t], s]^T``   (in_features -> rank)
* expand:  ``y[t, off_s:off_s+n_s] += scale[t] * buf[s, t] @ lora_b[slot[t], off_s:off_s+n_s, :]^T``

Every implementation multiplies a float32 value by the strength (the shrink or the summed
term, before the term is rounded to y's dtype) or skips the multiply, so tokens at strength
1.0 get bit for bit the result they got before strengths existed.

Storage layout (allocated by the engine, one set per targeted projection and layer):

* ``lora_a``: ``[num_slots, num_slices, max_rank, in_features]``. Slice ``s`` is the A
  matrix of the ``s``-th fused projection (q/k/v, gate/up; one slice otherwise). Rank rows
  ``r >= slot_ranks[slot]`` must be zero: the Triton kernels never read them, the torch
  backend's decode path may.
* ``lora_b``: ``[num_slots, out_total, max_rank]``. Slice ``s`` occupies output rows
  ``slice_offsets[s]:slice_offsets[s+1]`` (slices may differ in width: q/k/v with GQA,
  gate/up). The LoRA scale is folded into B. Rank columns beyond the slot's rank must be
  zero, as in lora_a.
* ``slot_ranks``: ``[num_slots]`` int32 on the device: the true rank of each slot's
  adapter, 0 for an empty slot. Kernels skip rank blocks beyond it, so a batch that mixes
  rank 8 and rank 64 adapters does not pay rank 64 for every token.
* ``slot_ids``: ``[T]`` int32 (or int64): the slot of each token, -1 = no adapter. Rows
  with -1 cost nothing and are left untouched in ``y``.

Per-step metadata lives in a :class:`LoRABatch` (fixed-size device buffers, refilled in
place without host synchronisation, so CUDA graphs can capture the kernels that read it).

This module is the front that model code imports: each wrapper checks its arguments,
picks the implementation the :class:`LoRAPlan` names for the call's token count, and has
a ``Semantics:`` block with the reference computation. Implementations, by algorithm:
``lora_bgmv`` (token-major Triton kernels, the decode path), ``lora_sgmv`` (slot-grouped
Triton kernels, larger steps), ``lora_torch`` (torch ops), ``lora_cpu`` (the compiled
float32 CPU kernel), and the kernels that fold an expand into the op reading its output
(``lora_silu``, ``lora_norm``, ``qkv_epilogue``). Without a plan a wrapper uses
``LoRAPlan.for_device`` of its tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import lora_bgmv, lora_cpu, lora_norm, lora_sgmv, lora_silu, lora_torch, qkv_epilogue
from .fused_ops import add_rms_norm, head_rms_norm_, rope_, silu_and_mul
from .lora_batch import LoRABatch, build_lora_batch
from .lora_checks import check_b, check_device, check_expand, check_shrink
from .lora_plan import FOLDED_EXPAND_MAX_RANK, LoRAPlan
from .lora_rows import RowTerms, apply_row_terms
from .paged_attention import write_kv
from .triton_support import triton_runs_on

__all__ = [
    "LoRABatch",
    "LoRAPlan",
    "RowTerms",
    "add_lora",
    "add_rms_norm_lora",
    "build_lora_batch",
    "lora_expand",
    "lora_expand_shrunk_in_gemm",
    "lora_shrink",
    "qkv_rope_write",
    "silu_and_mul_lora",
]


def _plan_for(plan: LoRAPlan | None, x: torch.Tensor) -> LoRAPlan:
    """``plan``, or the kernels' own choice for ``x``'s device and dtype."""
    return plan if plan is not None else LoRAPlan.for_device(x.device, x.dtype)


def _fused_ops_backend(plan: LoRAPlan) -> str:
    """The backend of the elementwise op that follows an expand the plan does not fold: the
    plan's, except that a Numba plan leaves the CPU choice to ``fused_ops`` ("auto": Numba
    norms, torch's vectorised SiLU)."""
    return "auto" if plan.backend == "numba" else plan.backend


def _check_backend(plan: LoRAPlan, device: torch.device) -> None:
    """ValueError when the plan's backend cannot run on ``device``."""
    if plan.backend == "triton" and not triton_runs_on(device):
        raise ValueError(f"backend='triton' needs CUDA tensors (got {device}) or TRITON_INTERPRET=1")
    if plan.backend == "numba" and device.type != "cpu":
        raise ValueError(f"backend='numba' needs CPU tensors, got {device}")


def lora_shrink(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    batch: LoRABatch,
    out: torch.Tensor | None = None,
    plan: LoRAPlan | None = None,
) -> torch.Tensor:
    """Project every token onto its adapter's A matrices: ``[T, K] -> [S, T, R]`` float32.

    Args:
        x: ``[T, in_features]`` activations (fp32 / bf16 / fp16), any strides.
        lora_a: ``[num_slots, num_slices, max_rank, in_features]``, x's dtype.
        batch: the step's :class:`LoRABatch` (``T <= batch.max_tokens``).
        out: optional float32 ``[num_slices, T, max_rank]`` to write into.
        plan: which kernels run (backend ``"numba"`` runs as torch here).

    Returns ``buf`` (``out`` when given). Entries of tokens with slot -1, and entries
    ``r >= slot_ranks[slot]`` (rank blocks the kernels skip), are unspecified on the
    Triton backend; the torch backend writes zeros there.

    Semantics::

        buf = torch.empty(S, T, R, dtype=torch.float32)
        for t in range(T):
            l = slot_ids[t]
            if l >= 0:
                for s in range(S):
                    buf[s, t] = (x[t].float() @ lora_a[l, s].float().T)
    """
    check_shrink(x, lora_a, batch)
    plan = _plan_for(plan, x)
    num_slices, max_rank = lora_a.shape[1], lora_a.shape[2]
    shape = (num_slices, x.shape[0], max_rank)
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.dtype != torch.float32:
            raise ValueError("out must be a float32 tensor")
        if tuple(out.shape) != shape:
            raise ValueError(f"out must have shape {shape}, got {tuple(out.shape)}")
        if out.device != x.device:
            raise ValueError(f"out is on {out.device}, x on {x.device}")
    _check_backend(plan, x.device)
    if plan.backend == "triton":
        if out is None:
            out = torch.empty(shape, dtype=torch.float32, device=x.device)
        if plan.uses_bgmv(x.shape[0]):
            return torch.sum(lora_bgmv.shrink_partials(x, lora_a, batch, plan), dim=0, out=out)
        return lora_sgmv.shrink(x, lora_a, batch, out)
    if out is None:
        out = torch.zeros(shape, dtype=torch.float32, device=x.device)
    else:
        out.zero_()
    lora_torch.shrink(x, lora_a, batch, out, plan)
    return out


def lora_expand(
    y: torch.Tensor,
    buf: torch.Tensor,
    lora_b: torch.Tensor,
    batch: LoRABatch,
    slice_offsets: Sequence[int],
    plan: LoRAPlan | None = None,
) -> torch.Tensor:
    """Add each token's ``buf @ B^T`` into its output slices of ``y``, in place.

    Args:
        y: ``[T, out_total]`` (fp32 / bf16 / fp16), updated in place; rows with slot -1
            are not touched.
        buf: float32 ``[num_slices, T, max_rank]`` from :func:`lora_shrink`; columns
            ``r >= slot_ranks[slot]`` are ignored (taken as zero, like B's padding).
        lora_b: ``[num_slots, out_total, max_rank]``, y's dtype, scale folded in.
        batch: the step's :class:`LoRABatch`.
        slice_offsets: ``num_slices + 1`` ints; slice ``s`` is ``y[:, off[s]:off[s+1]]``.
        plan: which kernels run (backend ``"numba"`` runs as torch here).

    Returns ``y``.

    Semantics::

        for t in range(T):
            l = slot_ids[t]
            if l >= 0:
                for s in range(S):
                    lo, hi = slice_offsets[s], slice_offsets[s + 1]
                    y[t, lo:hi] += (token_scales[t] * buf[s, t] @ lora_b[l, lo:hi].float().T).to(y.dtype)
    """
    offs = check_expand(y, buf, lora_b, batch, slice_offsets)
    plan = _plan_for(plan, y)
    _check_backend(plan, y.device)
    if plan.backend == "triton":
        if plan.uses_bgmv(y.shape[0]):
            lora_bgmv.expand(y, buf.unsqueeze(0), lora_b, batch, offs, plan)
        else:
            lora_sgmv.expand(y, buf.unsqueeze(0), lora_b, batch, offs)
        return y
    lora_torch.expand(y, buf, lora_b, batch, offs, plan)
    return y


def lora_expand_shrunk_in_gemm(
    y: torch.Tensor,
    shrunk: torch.Tensor,
    lora_b: torch.Tensor,
    batch: LoRABatch,
    slice_offsets: Sequence[int],
    plan: LoRAPlan | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """The expand for a shrink computed against EVERY slot, in place; returns ``y``.

    ``shrunk[t, l, s]`` is ``x[t] @ lora_a[l, s]^T`` for every slot ``l`` (``[T, num_slots,
    num_slices, max_rank]``, any float dtype, any strides), as the shrink in GEMM produces
    it (one GEMM over the base weight with every slot's A rows appended); each token reads
    its own slot's entry. Other arguments as in :func:`lora_expand`. One Triton launch, token-major
    where ``plan.uses_bgmv`` and slot-grouped above; on the torch backend the rows are gathered and
    the torch expand runs.

    Semantics::

        for t in range(T):
            l = slot_ids[t]
            if l >= 0:
                for s in range(S):
                    lo, hi = slice_offsets[s], slice_offsets[s + 1]
                    h = token_scales[t] * shrunk[t, l, s].float()
                    y[t, lo:hi] += (h @ lora_b[l, lo:hi].float().T).to(y.dtype)
    """
    if validate:
        if not isinstance(shrunk, torch.Tensor) or shrunk.dim() != 4 or not shrunk.is_floating_point():
            raise ValueError("shrunk must be a float tensor [num_tokens, num_slots, num_slices, max_rank]")
        check_device(batch, shrunk=shrunk)
        offs = check_b(y, lora_b, batch, shrunk.shape[2], shrunk.shape[3], slice_offsets)
        if shrunk.shape[0] != y.shape[0]:
            raise ValueError(f"shrunk has {shrunk.shape[0]} tokens but y has {y.shape[0]}")
        if shrunk.shape[1] != lora_b.shape[0]:
            raise ValueError(f"shrunk has {shrunk.shape[1]} slots but lora_b has {lora_b.shape[0]}")
    else:
        offs = tuple(slice_offsets)
    plan = _plan_for(plan, y)
    _check_backend(plan, y.device)
    if plan.uses_bgmv(y.shape[0]):
        return lora_bgmv.expand_shrunk_in_gemm(y, shrunk, lora_b, batch, offs, plan)
    if plan.backend == "triton":
        return lora_sgmv.expand_shrunk_in_gemm(y, shrunk, lora_b, batch, offs)
    lora_torch.expand_shrunk_in_gemm(y, shrunk, lora_b, batch, offs, plan)
    return y


def add_lora(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    batch: LoRABatch,
    slice_offsets: Sequence[int],
    plan: LoRAPlan | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """``y += LoRA(x)`` for a batch mixing adapters: shrink then expand. Returns ``y``.

    Shapes as in :func:`lora_shrink` and :func:`lora_expand`; ``y`` is ``[T, out_total]``
    in x's dtype and rows with slot -1 are left untouched. ``validate=False`` skips the
    argument checks (about 20 us a call on the CPU) for callers whose tensors are consistent
    by construction, such as the engine's slot buffers; ``slice_offsets`` must then be a
    tuple of ints. Backend ``"numba"`` computes float32 only.

    Semantics::

        buf = lora_shrink(x, lora_a, batch)        # [S, T, R] float32
        lora_expand(y, buf, lora_b, batch, slice_offsets)   # times batch.token_scales[t]
    """
    if validate:
        check_shrink(x, lora_a, batch)
        offs = check_b(y, lora_b, batch, lora_a.shape[1], lora_a.shape[2], slice_offsets)
        if y.dtype != x.dtype:
            raise ValueError(f"y dtype {y.dtype} differs from x dtype {x.dtype}")
        if y.shape[0] != x.shape[0]:
            raise ValueError(f"y has {y.shape[0]} tokens but x has {x.shape[0]}")
    else:
        offs = tuple(slice_offsets)
    plan = _plan_for(plan, x)
    _check_backend(plan, x.device)
    num_tokens = x.shape[0]
    if plan.backend == "triton":
        if plan.uses_bgmv(num_tokens):
            part = lora_bgmv.shrink_partials(x, lora_a, batch, plan)  # [splits, S, T, R] float32
            lora_bgmv.expand(y, part, lora_b, batch, offs, plan)
        else:
            part = lora_sgmv.shrink_partials(x, lora_a, batch)  # [splits, S, T, R] float32
            lora_sgmv.expand(y, part, lora_b, batch, offs)
        return y
    if plan.backend == "numba":
        if x.dtype != torch.float32:
            raise ValueError(f"backend='numba' computes float32 only, got {x.dtype}")
        if plan.uses_numba(num_tokens):
            lora_cpu.add_lora_cpu(y, x, lora_a, lora_b, batch.host_arrays(), offs)
            return y
    lora_torch.add_lora(y, x, lora_a, lora_b, batch, offs, plan)
    return y


def silu_and_mul_lora(
    gate_up: torch.Tensor,
    shrunk: torch.Tensor,
    lora_b: torch.Tensor,
    batch: LoRABatch,
    plan: LoRAPlan | None = None,
    rows: RowTerms | None = None,
) -> torch.Tensor:
    """``silu(gate) * up`` after adding each token's gate/up LoRA term (and its slot's DoRA /
    lora_bias row terms); returns ``[T, I]``.

    Args:
        gate_up: ``[T, 2 I]`` base output of the gate/up GEMM (gate then up), last dim
            contiguous, any row stride. Left unspecified afterwards (the unfolded path adds
            the LoRA term into it).
        shrunk: ``[T, num_slots, 2, max_rank]``: every slot's shrink (as for
            :func:`lora_expand_shrunk_in_gemm`), any float dtype and strides.
        lora_b: ``[num_slots, 2 I, max_rank]``, gate_up's dtype, scale folded in.
        batch: the step's :class:`LoRABatch`.
        plan: one launch (``lora_silu``) where ``plan.folds_expand``; otherwise the expand
            and SiLU-and-mul run one after the other.
        rows: the layer's gate/up :class:`RowTerms` ``[slots + 1, 2 I]``, or None.

    Semantics::

        lora_expand_shrunk_in_gemm(gate_up, shrunk, lora_b, batch, (0, I, 2 * I))
        if rows is not None:
            gate_up = apply_row_terms(gate_up, rows, batch)
        return silu_and_mul(gate_up)
    """
    num_tokens, width = gate_up.shape
    if width % 2 or gate_up.stride(1) != 1:
        raise ValueError(f"gate_up must be [T, 2 I] with a contiguous last dim, got {tuple(gate_up.shape)}")
    plan = _plan_for(plan, gate_up)
    _check_backend(plan, gate_up.device)
    if not plan.folds_expand(num_tokens, lora_b.shape[-1]):
        half = width // 2
        lora_expand_shrunk_in_gemm(gate_up, shrunk, lora_b, batch, (0, half, width), plan)
        if rows is not None:
            gate_up = apply_row_terms(gate_up, rows, batch)
        return silu_and_mul(gate_up, backend=_fused_ops_backend(plan))
    return lora_silu.launch(gate_up, shrunk, lora_b, batch, plan, rows)


def add_rms_norm_lora(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    shrunk: torch.Tensor,
    lora_b: torch.Tensor,
    batch: LoRABatch,
    counters: torch.Tensor,
    plan: LoRAPlan | None = None,
    rows: RowTerms | None = None,
) -> torch.Tensor:
    """``residual += x + LoRA`` in place (the LoRA term with its slot's DoRA / lora_bias row
    terms), then return RMSNorm of the new residual ``[T, H]``.

    Args:
        x: ``[T, H]`` base output of the o or down GEMM (last dim contiguous, any row stride);
            left unspecified afterwards (the unfolded path adds the LoRA term into it).
        residual: ``[T, H]`` residual stream, x's dtype, updated in place.
        weight: ``[H]`` RMSNorm weight; ``eps`` its epsilon.
        shrunk: ``[T, num_slots, 1, max_rank]``: every slot's shrink (as for
            :func:`lora_expand_shrunk_in_gemm`).
        lora_b: ``[num_slots, H, max_rank]``, x's dtype, scale folded in.
        batch: the step's :class:`LoRABatch`.
        counters: int32 ``[>= T]`` zeros on x's device, kept by the caller across launches
            (each launch leaves them zero).
        plan: one launch (``lora_norm``) where ``plan.folds_expand``; otherwise the expand
            and ``add_rms_norm`` run one after the other.
        rows: the layer's :class:`RowTerms` ``[slots + 1, H]`` of the projection, or None.

    Semantics::

        lora_expand_shrunk_in_gemm(x, shrunk, lora_b, batch, (0, H))
        if rows is not None:
            x = apply_row_terms(x, rows, batch)
        return add_rms_norm(x, residual, weight, eps)
    """
    plan = _plan_for(plan, x)
    _check_backend(plan, x.device)
    num_tokens, hidden = x.shape
    if not plan.folds_expand(num_tokens, lora_b.shape[-1]):
        lora_expand_shrunk_in_gemm(x, shrunk, lora_b, batch, (0, hidden), plan)
        if rows is not None:
            x = apply_row_terms(x, rows, batch)
        return add_rms_norm(x, residual, weight, eps, backend=_fused_ops_backend(plan))
    return lora_norm.launch(x, residual, weight, eps, shrunk, lora_b, batch, counters, plan, rows)


def qkv_rope_write(
    qkv: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    cos_sin: torch.Tensor,
    positions: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    lora: tuple[torch.Tensor, torch.Tensor, LoRABatch] | None = None,
    plan: LoRAPlan | None = None,
    qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None,
    rows: RowTerms | None = None,
) -> torch.Tensor:
    """LoRA expand (optional), q/k norms per head (optional), RoPE on q and k, and k / v into the
    paged cache; returns q ``[T, Hq, D]``.

    Args:
        qkv: ``[T, (Hq + 2 Hkv) * D]`` output of the q/k/v GEMM (last dim contiguous, any row
            stride); q is rotated in place, k and v are left unspecified.
        cos_sin, positions: as for ``rope_`` (float32 ``[positions, D]``, ``[T]``).
        k_cache, v_cache, slot_mapping: as for ``write_kv``.
        lora: ``(shrunk [T, slots, 3, R], lora_b [slots, (Hq + 2 Hkv) * D, R], batch)`` as for
            :func:`lora_expand_shrunk_in_gemm`, or None (base rows only).
        plan: one Triton launch (``qkv_epilogue``) where ``plan.fused_qkv``, for a power-of-two
            head_dim >= 8 and LoRA ranks up to 64; otherwise the launches below, one after the other.
            Above ``plan.bgmv_max_tokens`` tokens the Triton backend runs the LoRA expand (and row
            terms) as its own slot-grouped launch first.
        qk_norm: ``(q_weight [D], k_weight [D], eps)``: Qwen3's RMSNorm of each q and k head,
            after the LoRA term and before RoPE; None: no norm.
        rows: the layer's q/k/v :class:`RowTerms` ``[slots + 1, (Hq + 2 Hkv) * D]`` (with
            ``lora`` only; a q/k/v GEMM with its own bias keeps the unfolded path), or None.

    Semantics::

        if lora is not None:
            shrunk, lora_b, batch = lora
            offsets = (0, q_size, q_size + kv_size, q_size + 2 * kv_size)
            lora_expand_shrunk_in_gemm(qkv, shrunk, lora_b, batch, offsets)
            if rows is not None:
                qkv[:] = apply_row_terms(qkv, rows, batch)
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=1)  # viewed as [T, heads, D]
        if qk_norm is not None:
            q_weight, k_weight, eps = qk_norm
            head_rms_norm_(q, q_weight, eps); head_rms_norm_(k, k_weight, eps)
        rope_(q, cos_sin, positions); rope_(k, cos_sin, positions)
        write_kv(k, v, k_cache, v_cache, slot_mapping)
        return q
    """
    num_tokens, width = qkv.shape
    head_dim = cos_sin.shape[1]
    heads = num_q_heads + 2 * num_kv_heads
    if width != heads * head_dim or qkv.stride(1) != 1:
        raise ValueError(
            f"qkv must be [T, {heads * head_dim}] with a contiguous last dim, got {tuple(qkv.shape)}"
        )
    plan = _plan_for(plan, qkv)
    q_size, kv_size = num_q_heads * head_dim, num_kv_heads * head_dim
    if lora is not None and plan.backend == "triton" and not plan.uses_bgmv(num_tokens):
        # a large step (a shrink in GEMM over a narrow slot span): the slot-grouped expand reads
        # each adapter's B tiles once per block of its tokens; the fused launch would read them
        # once per token
        shrunk, lora_b, batch = lora
        lora_expand_shrunk_in_gemm(qkv, shrunk, lora_b, batch, (0, q_size, q_size + kv_size, width), plan)
        if rows is not None:
            qkv.copy_(apply_row_terms(qkv, rows, batch))
        lora, rows = None, None
    max_rank = lora[1].shape[-1] if lora is not None else 0
    if (
        plan.fused_qkv
        and head_dim >= 8
        and head_dim & (head_dim - 1) == 0
        and max_rank <= FOLDED_EXPAND_MAX_RANK
    ):
        if not triton_runs_on(qkv.device):
            raise ValueError(f"fused_qkv needs CUDA tensors (got {qkv.device}) or TRITON_INTERPRET=1")
        return qkv_epilogue.launch(
            qkv, num_q_heads, num_kv_heads, cos_sin, positions, k_cache, v_cache, slot_mapping, lora, plan,
            qk_norm, rows,
        )  # fmt: skip
    q = qkv[:, :q_size].view(num_tokens, num_q_heads, head_dim)
    k = qkv[:, q_size : q_size + kv_size].view(num_tokens, num_kv_heads, head_dim)
    v = qkv[:, q_size + kv_size :].view(num_tokens, num_kv_heads, head_dim)
    if lora is not None:
        shrunk, lora_b, batch = lora
        lora_expand_shrunk_in_gemm(qkv, shrunk, lora_b, batch, (0, q_size, q_size + kv_size, width), plan)
        if rows is not None:
            qkv.copy_(apply_row_terms(qkv, rows, batch))
    elif rows is not None:
        raise ValueError("row terms come with a LoRA term")
    if qk_norm is not None:
        q_weight, k_weight, eps = qk_norm
        head_rms_norm_(q, q_weight, eps)
        head_rms_norm_(k, k_weight, eps)
    rope_(q, cos_sin, positions)
    rope_(k, cos_sin, positions)
    write_kv(k, v, k_cache, v_cache, slot_mapping)
    return q
