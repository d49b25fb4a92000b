"""LoRA expand + RoPE + K/V cache write in one launch equals the launches it replaces, bit for bit."""

from __future__ import annotations

import os
import sys
from dataclasses import replace

if "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from multilora_studio.kernels import (
    LoRAPlan,
    build_lora_batch,
    lora_expand_shrunk_in_gemm,
    qkv_rope_write,
    rope_,
    write_kv,
)
from multilora_studio.kernels.lora_rows import RowTerms, apply_row_terms
from tests.kernels.device import DEVICE, TRITON_OK

pytestmark = pytest.mark.skipif(not TRITON_OK, reason="needs Triton")
# the Triton kernels, with the q/k/v epilogue as one launch
FUSED = replace(LoRAPlan.for_device(DEVICE), backend="triton", fused_qkv=True) if TRITON_OK else None

HQ, HKV, D = 4, 2, 16  # GQA: two q heads a kv head
SLOTS, MAX_RANK = 3, 16
RANKS = [8, 16, 0]  # the last slot is empty
BLOCKS, BLOCK_SIZE = 6, 4


# per-token adapter strengths of the "scaled" cases (1.0 among them: those rows are unchanged)
STRENGTHS = torch.tensor([0.0, 0.5, 1.0, 2.0])


def make(dtype: torch.dtype, num_tokens: int, with_lora: bool, seed: int, scaled: bool = False):
    gen = torch.Generator().manual_seed(seed)
    width = (HQ + 2 * HKV) * D
    qkv = torch.randn(num_tokens, width + 8, generator=gen).to(dtype)[:, :width]  # strided rows
    positions = torch.randint(0, 30, (num_tokens,), generator=gen)
    slot_mapping = torch.randperm(BLOCKS * BLOCK_SIZE, generator=gen)[:num_tokens]
    slot_mapping[::3] = -1  # padding tokens write nothing
    angles = torch.outer(torch.arange(32.0), 10000.0 ** -(torch.arange(0, D, 2) / D))  # [32, D/2]
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1)  # [32, D] float32: cos, then sin
    k_cache = torch.randn(BLOCKS, BLOCK_SIZE, HKV, D, generator=gen).to(dtype)
    lora = None
    if with_lora:
        slot_ids = torch.randint(-1, SLOTS, (num_tokens,), generator=gen, dtype=torch.int32)
        lora_b = torch.randn(SLOTS, width, MAX_RANK, generator=gen) / 4
        for slot, rank in enumerate(RANKS):
            lora_b[slot, :, rank:] = 0
        shrunk = torch.randn(num_tokens, SLOTS, 3, MAX_RANK, generator=gen).to(dtype)
        for t, slot in enumerate(slot_ids.tolist()):  # entries a token must not read: NaN
            for other in range(SLOTS):
                if other != slot:
                    shrunk[t, other] = float("nan")
            if slot >= 0:
                shrunk[t, slot, :, RANKS[slot] :] = float("nan")
        scales = STRENGTHS[torch.arange(num_tokens) % len(STRENGTHS)].to(DEVICE) if scaled else None
        batch = build_lora_batch(
            slot_ids.to(DEVICE), torch.tensor(RANKS, dtype=torch.int32, device=DEVICE), SLOTS, scales
        )
        lora = (shrunk.to(DEVICE), lora_b.to(dtype).to(DEVICE), batch)
    to = lambda x: x.to(DEVICE)  # noqa: E731
    return to(qkv), to(positions), to(slot_mapping), to(cos_sin), to(k_cache), to(k_cache.clone() * 2), lora


def assert_same_rotation(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Bit for bit; in float32 compiled for a GPU within two ulps of the largest value, since
    the compiler may contract RoPE's multiply-adds differently in the two kernels (a
    difference that the cancellation in ``x1 c - x2 s`` does not shrink with the result;
    bf16 / fp16 round both to the same value). A wrong position or head is off by O(1)."""
    if actual.dtype != torch.float32 or actual.device.type != "cuda":
        assert torch.equal(actual.view(torch.int8), expected.view(torch.int8))
        return
    bound = 2 * torch.finfo(torch.float32).eps * expected.abs().max()
    assert (actual - expected).abs().max() <= bound


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(
    ("with_lora", "scaled"), [(False, False), (True, False), (True, True)], ids=["base", "lora", "scaled"]
)
@pytest.mark.parametrize("num_tokens", [1, 7])
def test_one_launch_equals_expand_rope_and_cache_write(dtype, with_lora, scaled, num_tokens):
    qkv, positions, slot_mapping, cos_sin, k_cache, v_cache, lora = make(
        dtype, num_tokens, with_lora, num_tokens, scaled
    )
    ref_qkv, ref_k, ref_v = qkv.clone(), k_cache.clone(), v_cache.clone()
    q = qkv_rope_write(qkv, HQ, HKV, cos_sin, positions, k_cache, v_cache, slot_mapping, lora, FUSED)
    # the launches it replaces, on the same (Triton) backend
    q_size, kv_size = HQ * D, HKV * D
    if lora is not None:
        shrunk, lora_b, batch = lora
        offsets = (0, q_size, q_size + kv_size, q_size + 2 * kv_size)
        lora_expand_shrunk_in_gemm(ref_qkv, shrunk, lora_b, batch, offsets, FUSED)
    ref_q = ref_qkv[:, :q_size].view(num_tokens, HQ, D)
    k = ref_qkv[:, q_size : q_size + kv_size].view(num_tokens, HKV, D)
    v = ref_qkv[:, q_size + kv_size :].view(num_tokens, HKV, D)
    rope_(ref_q, cos_sin, positions, backend="triton")
    rope_(k, cos_sin, positions, backend="triton")
    write_kv(k, v, ref_k, ref_v, slot_mapping)
    assert q.data_ptr() == qkv.data_ptr()  # rotated in place
    assert_same_rotation(q, ref_q)
    assert_same_rotation(k_cache, ref_k)  # padding slots untouched too
    assert torch.equal(v_cache.view(torch.int8), ref_v.view(torch.int8))
    assert torch.isfinite(q).all()  # NaN in the entries a token must not read never reached it


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_strength_one_is_bit_for_bit_and_zero_is_the_base(dtype):
    """Rows at strength 1.0 give exactly what a batch without strengths gives; rows at 0 give
    exactly the base projection's rotation (no LoRA term)."""
    num_tokens = 8
    outs = {}
    for name, with_lora, scaled in (("plain", True, False), ("scaled", True, True), ("base", False, False)):
        qkv, positions, slot_mapping, cos_sin, k_cache, v_cache, lora = make(
            dtype, num_tokens, with_lora, 11, scaled
        )
        outs[name] = qkv_rope_write(
            qkv, HQ, HKV, cos_sin, positions, k_cache, v_cache, slot_mapping, lora, FUSED
        ).clone()
    strengths = STRENGTHS[torch.arange(num_tokens) % len(STRENGTHS)]
    at_one, at_zero = (strengths == 1.0).to(DEVICE), (strengths == 0.0).to(DEVICE)
    bits = lambda t: t.view(torch.int8)  # noqa: E731
    assert torch.equal(bits(outs["scaled"][at_one]), bits(outs["plain"][at_one]))
    assert torch.equal(bits(outs["scaled"][at_zero]), bits(outs["base"][at_zero]))
    moved = ~(at_one | at_zero)
    assert not torch.equal(outs["scaled"][moved], outs["plain"][moved])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("kinds", ["scale", "bias", "both"])
def test_row_terms_in_the_one_launch_equal_expand_rows_then_rope(dtype, kinds):
    """DoRA's per-row scale and lora_bias's bias (per slot, per-token strengths) folded into the
    one launch equal the expand, ``apply_row_terms``, RoPE and the cache write one after the
    other; rows without an adapter are the base rows' rotation."""
    num_tokens = 9
    qkv, positions, slot_mapping, cos_sin, k_cache, v_cache, lora = make(dtype, num_tokens, True, 5, True)
    shrunk, lora_b, batch = lora
    gen = torch.Generator().manual_seed(7)
    width = qkv.shape[1]
    scale = (1 + torch.randn(SLOTS + 1, width, generator=gen) / 4).to(dtype)
    bias = (torch.randn(SLOTS + 1, width, generator=gen) / 4).to(dtype)
    scale[-1], bias[-1] = 1, 0
    rows = RowTerms(
        scale.to(DEVICE) if kinds != "bias" else None, bias.to(DEVICE) if kinds != "scale" else None
    )
    ref_qkv, ref_k, ref_v = qkv.clone(), k_cache.clone(), v_cache.clone()
    q = qkv_rope_write(
        qkv, HQ, HKV, cos_sin, positions, k_cache, v_cache, slot_mapping, lora, FUSED, rows=rows
    )
    q_size, kv_size = HQ * D, HKV * D
    lora_expand_shrunk_in_gemm(ref_qkv, shrunk, lora_b, batch, (0, q_size, q_size + kv_size, width), FUSED)
    ref_qkv.copy_(apply_row_terms(ref_qkv, rows, batch))
    ref_q = ref_qkv[:, :q_size].view(num_tokens, HQ, D)
    k = ref_qkv[:, q_size : q_size + kv_size].view(num_tokens, HKV, D)
    v = ref_qkv[:, q_size + kv_size :].view(num_tokens, HKV, D)
    rope_(ref_q, cos_sin, positions, backend="triton")
    rope_(k, cos_sin, positions, backend="triton")
    write_kv(k, v, ref_k, ref_v, slot_mapping)
    if (
        dtype == torch.bfloat16 and DEVICE == "cpu"
    ):  # the interpreter rounds bf16 toward zero, torch to nearest
        for got, want in ((q, ref_q), (k_cache, ref_k), (v_cache, ref_v)):
            torch.testing.assert_close(got, want, rtol=2**-6, atol=2**-5)  # ~2 ulps of the inputs
        return
    if kinds == "both" and DEVICE == "cuda":
        # compiled for a GPU, the scale's product and the bias's sum may become one fused
        # multiply-add, which skips the product's rounding to the dtype: one rounding of the
        # dtype apart before RoPE, two ulps of the largest value after it. A wrong slot's row,
        # a term left out or a wrong strength is off by O(1).
        for got, want in ((q, ref_q), (k_cache, ref_k), (v_cache, ref_v)):
            bound = 2 * torch.finfo(dtype).eps * want.float().abs().max()
            assert (got.float() - want.float()).abs().max() <= bound
        return
    assert_same_rotation(q, ref_q)
    assert_same_rotation(k_cache, ref_k)
    assert torch.equal(v_cache.view(torch.int8), ref_v.view(torch.int8))


def test_bad_input_is_refused():
    qkv, positions, slot_mapping, cos_sin, k_cache, v_cache, _ = make(torch.float32, 3, False, 0)
    with pytest.raises(ValueError, match="qkv must be"):
        qkv_rope_write(qkv[:, :-1], HQ, HKV, cos_sin, positions, k_cache, v_cache, slot_mapping, plan=FUSED)
    with pytest.raises(ValueError, match="slot_mapping must be"):
        qkv_rope_write(qkv, HQ, HKV, cos_sin, positions, k_cache, v_cache, slot_mapping.int(), plan=FUSED)
    with pytest.raises(ValueError, match="k_cache/v_cache"):
        qkv_rope_write(qkv, HQ, HKV, cos_sin, positions, k_cache[:, :, :1], v_cache, slot_mapping, plan=FUSED)


def hf_rotated(x: torch.Tensor, cos_sin: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """HF's rotate-half RoPE of ``x`` [T, heads, D] in float32, rounded to its dtype."""
    cs = cos_sin[positions][:, None, :]  # [T, 1, D]
    cos, sin = cs[..., : D // 2], cs[..., D // 2 :]
    x1, x2 = x[..., : D // 2].float(), x[..., D // 2 :].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def hf_head_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3RMSNorm over the last dim of ``x`` [T, heads, D]."""
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("fused", [True, False], ids=["one-launch", "launches"])
def test_qk_norms_come_after_the_lora_term_and_before_rope(dtype, fused):
    """Qwen3's q/k RMSNorm per head, in the one launch and in the launches: q = RoPE(norm(q + LoRA))."""
    num_tokens, eps = 7, 1e-6
    qkv, positions, slot_mapping, cos_sin, k_cache, v_cache, lora = make(dtype, num_tokens, True, 5)
    gen = torch.Generator().manual_seed(3)
    q_weight, k_weight = ((torch.rand(D, generator=gen) + 0.5).to(dtype).to(DEVICE) for _ in range(2))
    ref_qkv, plain_qkv = qkv.clone(), qkv.clone()
    plan = FUSED if fused else replace(FUSED, fused_qkv=False)
    q = qkv_rope_write(
        qkv,
        HQ,
        HKV,
        cos_sin,
        positions,
        k_cache,
        v_cache,
        slot_mapping,
        lora,
        plan,
        (q_weight, k_weight, eps),
    )
    assert q.data_ptr() == qkv.data_ptr()
    shrunk, lora_b, batch = lora
    q_size, kv_size = HQ * D, HKV * D
    offsets = (0, q_size, q_size + kv_size, q_size + 2 * kv_size)
    lora_expand_shrunk_in_gemm(ref_qkv, shrunk, lora_b, batch, offsets, plan)
    ref_q = hf_rotated(
        hf_head_norm(ref_qkv[:, :q_size].view(num_tokens, HQ, D), q_weight, eps), cos_sin, positions
    )
    ref_k = hf_rotated(
        hf_head_norm(ref_qkv[:, q_size : q_size + kv_size].view(num_tokens, HKV, D), k_weight, eps),
        cos_sin,
        positions,
    )
    tolerance = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=1.6e-2)
    torch.testing.assert_close(q, ref_q, **tolerance)
    written = slot_mapping >= 0
    cached = k_cache.view(-1, HKV, D)[slot_mapping[written]]  # [written, Hkv, D]
    torch.testing.assert_close(cached, ref_k[written], **tolerance)
    v = ref_qkv[:, q_size + kv_size :].view(num_tokens, HKV, D)
    assert torch.equal(v_cache.view(-1, HKV, D)[slot_mapping[written]], v[written])  # v: no norm
    without = qkv_rope_write(
        plain_qkv, HQ, HKV, cos_sin, positions, k_cache, v_cache, slot_mapping, lora, plan
    )
    assert not torch.allclose(without, ref_q, atol=1e-2)  # the norms changed q
