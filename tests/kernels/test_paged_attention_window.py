"""Sliding-window attention and attention-logit soft-capping on every paged attention backend,
against a float64 reference written here (HF semantics: a query at position p sees keys k with
p - window < k <= p; scores s = (q . k) * scale become softcap * tanh(s / softcap))."""

from __future__ import annotations

import os
import sys

if "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from multilora_studio.kernels.paged_attention import paged_attention
from tests.kernels.device import DEVICE
from tests.kernels.grid import INTERPRETED
from tests.kernels.test_paged_attention import NUMBA_OK, TOL, make_case, needs_triton

# (q_len, seq_len) per sequence, and the max_query_len hint.
STEPS = {
    # decodes: contexts shorter than, equal to and longer than the window; block edges
    "decode": ([(1, 1), (1, 12), (1, 13), (1, 40), (1, 77)], 1),
    # a prefill chunk after cached keys (its window reaches back into them), a prompt
    "prefill": ([(21, 50), (30, 30)], None),
    # a chunk after a prefix, decodes, a prompt
    "mixed": ([(1, 45), (19, 49), (1, 3), (17, 17), (1, 16)], 19),
}
# (window, softcap): window below, at and above the block size 8 / the context, cap alone and both
OPTIONS = [(12, None), (5, None), (1, None), (200, None), (None, 50.0), (13, 2.0)]


def window_reference(q, k_cache, v_cache, tables, seq_lens, qsl, scale, window, softcap):
    """Float64, one query at a time: keys max(0, p + 1 - window)..p of its sequence."""
    q, k_cache, v_cache = (t.cpu().double() for t in (q, k_cache, v_cache))
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = q.shape[1] // num_kv_heads
    out = torch.zeros_like(q)
    starts = qsl.tolist()
    for i, length in enumerate(seq_lens.tolist()):
        q_len = starts[i + 1] - starts[i]
        for j in range(q_len):
            pos = length - q_len + j
            lo = 0 if window is None else max(0, pos + 1 - window)
            keys = range(lo, pos + 1)
            blocks = [int(tables[i, p // block_size]) for p in keys]
            k = torch.stack(
                [k_cache[b, p % block_size] for b, p in zip(blocks, keys, strict=True)]
            )  # [n, Hkv, D]
            v = torch.stack([v_cache[b, p % block_size] for b, p in zip(blocks, keys, strict=True)])
            for h in range(q.shape[1]):
                s = k[:, h // group] @ q[starts[i] + j, h] * scale  # [n]
                if softcap is not None:
                    s = softcap * torch.tanh(s / softcap)
                out[starts[i] + j, h] = torch.softmax(s, 0) @ v[:, h // group]
    return out


def check(step, heads, dtype, backend, window, softcap, **kwargs):
    seqs, max_query_len = STEPS[step]
    gen = torch.Generator().manual_seed(hash((step, heads, window, softcap)) % 2**31)
    case = make_case(seqs, *heads, 32, 8, dtype, pad_tokens=2, gen=gen)
    q, k_cache, v_cache, tables, seq_lens, qsl = case
    scale = 0.3  # large enough that the cap of 2.0 bites
    out = torch.full_like(q, float("nan"))
    paged_attention(
        q, k_cache, v_cache, tables, seq_lens, qsl, scale, out=out, max_query_len=max_query_len,
        backend=backend, sliding_window=window, softcap=softcap, **kwargs,
    )  # fmt: skip
    n = int(qsl[-1])
    assert torch.isnan(out[n:]).all(), "padding rows past query_start_loc[-1] were written"
    ref = window_reference(q, k_cache, v_cache, tables, seq_lens, qsl, scale, window, softcap)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out[:n].double().cpu(), ref[:n], atol=atol, rtol=rtol)


CPU_ONLY = pytest.mark.skipif(DEVICE != "cpu", reason="CPU backends")
NEEDS_NUMBA = pytest.mark.skipif(not NUMBA_OK, reason="needs Numba")


@CPU_ONLY
@pytest.mark.parametrize("options", OPTIONS, ids=str)
@pytest.mark.parametrize("step", list(STEPS))
@pytest.mark.parametrize(
    ("backend", "dtype"),
    [
        ("torch", torch.float32),
        ("torch", torch.bfloat16),
        pytest.param("numba", torch.float32, marks=NEEDS_NUMBA),
    ],
    ids=str,
)
def test_cpu_backends(backend, dtype, step, options):
    check(step, (6, 2), dtype, backend, *options)


@NEEDS_NUMBA
@CPU_ONLY
@pytest.mark.parametrize("options", OPTIONS, ids=str)
@pytest.mark.parametrize("step", list(STEPS))
def test_cpu_batch_invariant(step, options):
    check(step, (6, 2), torch.float32, "torch", *options, batch_invariant=True)


# Under the interpreter each case costs seconds: a few that cover every code path between them
# (tiles cut by the window's lower edge, tiles skipped, split-K over the window, cap).
TRITON_CASES = [
    ("mixed", (6, 2), torch.float32, 12, None, {}),
    ("prefill", (4, 4), torch.bfloat16, 5, 2.0, {}),
    ("decode", (8, 2), torch.float32, 13, 2.0, {"num_splits": 3}),
    ("decode", (6, 2), torch.bfloat16, 200, None, {"num_splits": 2}),
    ("mixed", (6, 2), torch.float32, None, 2.0, {}),
    ("mixed", (6, 2), torch.float32, 13, 2.0, {"batch_invariant": True}),
]
if not INTERPRETED:  # natively: every step, option and head layout
    TRITON_CASES += [
        (step, heads, dtype, *options, extra)
        for step in STEPS
        for heads in [(4, 4), (6, 2), (8, 2)]
        for dtype in [torch.float32, torch.bfloat16]
        for options in OPTIONS
        for extra in [{}, {"batch_invariant": True}]
    ]


@needs_triton
@pytest.mark.parametrize(("step", "heads", "dtype", "window", "softcap", "extra"), TRITON_CASES)
def test_triton(step, heads, dtype, window, softcap, extra):
    check(step, heads, dtype, "triton", window, softcap, **extra)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sliding_window": 0}, "sliding_window must be a positive int"),
        ({"sliding_window": 4.0}, "sliding_window must be a positive int"),
        ({"sliding_window": True}, "sliding_window must be a positive int"),
        ({"sliding_window": torch.tensor(4)}, "sliding_window must be a positive int"),
        ({"softcap": 0.0}, "softcap must be a positive finite float"),
        ({"softcap": float("inf")}, "softcap must be a positive finite float"),
        ({"softcap": -1.0}, "softcap must be a positive finite float"),
        ({"softcap": torch.tensor(50.0)}, "softcap must be a positive finite float"),
    ],
    ids=str,
)
def test_option_errors(kwargs, match):
    case = make_case([(3, 10), (1, 7)], 4, 2, 32, 8, torch.float32)
    with pytest.raises(ValueError, match=match):
        paged_attention(*case, 0.1, **kwargs)
