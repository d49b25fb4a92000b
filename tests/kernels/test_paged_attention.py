"""Paged-KV attention: Triton (interpreter on CPU) and torch paths against a float64 reference."""

from __future__ import annotations

import os
import sys
import zlib

# The Triton kernels run on the CPU under the interpreter. tests/kernels/conftest.py (and
# `make test`) set this before triton is imported; set it here too when this module is run alone.
if "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from multilora_studio.kernels import paged_attention_cpu
from multilora_studio.kernels.paged_attention import (
    paged_attention,
    reference_paged_attention,
    write_kv,
)
from tests.kernels.device import DEVICE, TRITON_OK
from tests.kernels.grid import grid

needs_triton = pytest.mark.skipif(not TRITON_OK, reason="needs CUDA or TRITON_INTERPRET=1")

# (atol, rtol) of the output against the float64 reference, per dtype.
TOL = {
    torch.float32: (1e-4, 1e-4),
    torch.bfloat16: (3e-2, 3e-2),
    torch.float16: (4e-3, 4e-3),
}
DTYPES = list(TOL)
# (Hq, Hkv): GQA ratios 1, 3 and 4.
HEADS = [(4, 4), (6, 2), (8, 2)]

# Scenarios: (q_len, seq_len) per sequence; max_query_len hint (None = computed).
SCENARIOS = {
    # five decodes, contexts around and off block boundaries
    "decode": ([(1, 1), (1, 16), (1, 37), (1, 100), (1, 9)], 1),
    # two prompts without a prefix, lengths not multiples of the block size
    "prefill": ([(37, 37), (20, 20)], None),
    # a prefill chunk after a cached prefix, decodes, a prompt, an odd count
    "mixed": ([(1, 45), (19, 49), (1, 3), (33, 33), (1, 17)], 33),
}


def make_case(
    seqs: list[tuple[int, int]],
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    pad_tokens: int = 0,
    gen: torch.Generator | None = None,
):
    """Random step: physical blocks shuffled; unused table entries point at other sequences'
    blocks (even rows) or are -1 (odd rows), and every cache slot holds random data, so reads
    past seq_len show up as errors."""
    gen = gen or torch.Generator().manual_seed(0)
    nblocks = [-(-length // block_size) for _, length in seqs]
    num_blocks = sum(nblocks) + 5
    perm = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    width = max([*nblocks, 1]) + 2
    tables = perm[torch.randint(0, num_blocks, (len(seqs), width), generator=gen)]
    tables[1::2] = -1
    used = 0
    for i, n in enumerate(nblocks):
        tables[i, :n] = perm[used : used + n]
        used += n
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    num_tokens = sum(q for q, _ in seqs) + pad_tokens
    q = torch.randn(num_tokens, num_q_heads, head_dim, generator=gen).to(dtype)
    qsl = [0]
    for q_len, _ in seqs:
        qsl.append(qsl[-1] + q_len)
    return (
        q.to(DEVICE),
        k_cache.to(DEVICE),
        v_cache.to(DEVICE),
        tables.contiguous().to(DEVICE),
        torch.tensor([length for _, length in seqs], dtype=torch.int32, device=DEVICE),
        torch.tensor(qsl, dtype=torch.int32, device=DEVICE),
    )


def run_and_check(case, dtype, backend, max_query_len=None, num_splits=None, scale=None):
    if backend == "numba" and dtype != torch.float32:
        pytest.skip("the numba backend computes float32 only")
    q, k_cache, v_cache, tables, seq_lens, qsl = case
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    out = torch.full_like(q, float("nan"))  # poisoned
    res = paged_attention(
        q, k_cache, v_cache, tables, seq_lens, qsl, scale, out=out,
        max_query_len=max_query_len, backend=backend, num_splits=num_splits,
    )  # fmt: skip
    assert res is out
    ref = reference_paged_attention(q, k_cache, v_cache, tables, seq_lens, qsl, scale)
    n = int(qsl[-1])
    assert torch.isfinite(out[:n]).all(), "some rows of the output were not written"
    assert torch.isnan(out[n:]).all(), "padding rows past query_start_loc[-1] were written"
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out[:n].double().cpu(), ref[:n], atol=atol, rtol=rtol)
    return out


NUMBA_OK = paged_attention_cpu.AVAILABLE and DEVICE == "cpu"
# "numba": decode rows through the Numba kernel (float32 only), prefill rows as "torch".
BACKENDS = [
    "torch",
    pytest.param("triton", marks=needs_triton),
    pytest.param("numba", marks=pytest.mark.skipif(not NUMBA_OK, reason="needs Numba")),
]


# under the interpreter the Triton backend meets every scenario in every dtype, the GQA ratios in turn
@pytest.mark.parametrize(
    ("backend", "scenario", "dtype", "heads"),
    grid(BACKENDS, list(SCENARIOS), DTYPES, HEADS, interpreted=lambda backend: backend == "triton"),
)
def test_matches_reference(scenario, dtype, heads, backend):
    seqs, max_query_len = SCENARIOS[scenario]
    gen = torch.Generator().manual_seed(zlib.crc32(f"{scenario}{dtype}{heads}".encode()))
    case = make_case(seqs, *heads, 64, 16, dtype, pad_tokens=3, gen=gen)
    run_and_check(case, dtype, backend, max_query_len=max_query_len)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_block_size_8_head_dim_32(scenario, backend):
    seqs, max_query_len = SCENARIOS[scenario]
    case = make_case(seqs, 6, 2, 32, 8, torch.float32, gen=torch.Generator().manual_seed(3))
    run_and_check(case, torch.float32, backend, max_query_len=max_query_len)


@needs_triton
@pytest.mark.parametrize("num_splits", [1, 2, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_triton_decode_split_k(num_splits, dtype):
    seqs = [(1, 130), (1, 7), (1, 64), (1, 1)]
    case = make_case(seqs, 8, 2, 64, 16, dtype, gen=torch.Generator().manual_seed(num_splits))
    run_and_check(case, dtype, "triton", max_query_len=1, num_splits=num_splits)


@needs_triton
def test_triton_unified_kernel_serves_decode_steps():
    # max_query_len None on a decode-only step computes it; 2 forces the unified kernel.
    seqs = [(1, 20), (1, 50), (1, 3)]
    case = make_case(seqs, 6, 2, 64, 16, torch.float32, gen=torch.Generator().manual_seed(5))
    run_and_check(case, torch.float32, "triton", max_query_len=2)
    run_and_check(case, torch.float32, "triton", max_query_len=None)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("max_query_len", [1, None])
def test_padded_decode_batch(backend, max_query_len):
    """A CUDA-graph bucket: real decodes, padding sequences (q_len 0, seq_len 0), a padding
    sequence with q_len 1 and seq_len 0 (its row must be zeros), and padding tokens."""
    seqs = [(1, 33), (1, 5), (0, 0), (1, 0), (0, 0)]
    case = make_case(seqs, 8, 2, 64, 16, torch.float32, pad_tokens=2)
    out = run_and_check(case, torch.float32, backend, max_query_len=max_query_len)
    assert (out[2] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_long_prefill_tiles(backend):
    # several query tiles per sequence, a prefix, and a chunk that starts mid-block
    seqs = [(150, 170), (70, 70), (1, 90)]
    case = make_case(seqs, 9, 3, 64, 16, torch.float32, gen=torch.Generator().manual_seed(9))
    run_and_check(case, torch.float32, backend, max_query_len=150)


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_q_and_out(backend):
    # q as a view of a fused qkv projection output; out a view with a padded head stride
    seqs = [(5, 12), (1, 40)]
    q, k_cache, v_cache, tables, seq_lens, qsl = make_case(seqs, 4, 2, 32, 8, torch.float32)
    qkv = torch.randn(q.shape[0], 8 * 32, device=DEVICE)
    q = qkv[:, : 4 * 32].view(-1, 4, 32)
    out_buf = torch.full((q.shape[0], 5, 32), float("nan"), device=DEVICE)
    out = out_buf[:, :4]
    paged_attention(q, k_cache, v_cache, tables, seq_lens, qsl, 0.2, out=out, backend=backend)
    ref = reference_paged_attention(q, k_cache, v_cache, tables, seq_lens, qsl, 0.2)
    torch.testing.assert_close(out.double().cpu(), ref.cpu(), atol=1e-4, rtol=1e-4)
    assert torch.isnan(out_buf[:, 4]).all()


def test_empty_step():
    q, k_cache, v_cache, tables, seq_lens, qsl = make_case([(1, 4)], 4, 2, 32, 8, torch.float32)
    out = paged_attention(q[:0], k_cache, v_cache, tables[:0], seq_lens[:0], qsl[:1], 1.0)
    assert out.shape == (0, 4, 32)


def _write_kv_case(dtype):
    gen = torch.Generator().manual_seed(11)
    num_blocks, block_size, hkv, d = 6, 8, 3, 64
    k_cache = torch.randn(num_blocks, block_size, hkv, d, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, hkv, d, generator=gen).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:9]
    slots[[2, 5, 8]] = -1  # padding tokens
    k = torch.randn(9, hkv, d, generator=gen).to(dtype)
    v = torch.randn(9, hkv, d, generator=gen).to(dtype)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    keep = slots >= 0
    want_k.view(-1, hkv, d)[slots[keep]] = k[keep]
    want_v.view(-1, hkv, d)[slots[keep]] = v[keep]
    return tuple(t.to(DEVICE) for t in (k, v, k_cache, v_cache, slots, want_k, want_v))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_write_kv_torch(dtype):
    k, v, k_cache, v_cache, slots, want_k, want_v = _write_kv_case(dtype)
    write_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_write_kv_triton(dtype):
    from multilora_studio.kernels.paged_attention_triton import launch_write_kv

    k, v, k_cache, v_cache, slots, want_k, want_v = _write_kv_case(dtype)
    launch_write_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


def _valid_args():
    return [*make_case([(3, 10), (1, 7)], 4, 2, 32, 8, torch.float32), 0.1]


def _with(index, value):
    args = _valid_args()
    args[index] = value(args[index]) if callable(value) else value
    return args


ERROR_CASES = {
    "q 2-D": (_with(0, lambda t: t[:, 0]), "q must be"),
    "cache 3-D": (_with(1, lambda t: t[0]), "k_cache and v_cache must"),
    "v shape": (_with(2, lambda t: t[:-1]), "k_cache and v_cache must"),
    "head_dim": (_with(0, lambda t: t[..., :16].contiguous()), "head_dim"),
    "gqa": (_with(0, lambda t: t[:, :3].contiguous()), "multiple of num_kv_heads"),
    "dtype": (_with(0, lambda t: t.double()), "dtype"),
    "cache dtype": (_with(1, lambda t: t.half()), "must equal q dtype"),
    "int64 table": (_with(3, lambda t: t.long()), "block_tables"),
    "seq_lens len": (_with(4, lambda t: t[:1]), "seq_lens"),
    "qsl int64": (_with(5, lambda t: t.long()), "query_start_loc"),
    "non-contiguous cache": (
        _with(1, lambda t: t.transpose(0, 1).contiguous().transpose(0, 1)),
        "contiguous",
    ),
    "q last dim strided": (
        _with(0, lambda t: t.transpose(1, 2).contiguous().transpose(1, 2)),
        "last dimension",
    ),
    "device": (_with(4, lambda t: t.to("meta")), "is on meta"),
}


@pytest.mark.parametrize("name", list(ERROR_CASES))
def test_errors_raise_value_error(name):
    args, match = ERROR_CASES[name]
    with pytest.raises(ValueError, match=match):
        paged_attention(*args)


def test_option_errors():
    args = _valid_args()
    with pytest.raises(ValueError, match="backend"):
        paged_attention(*args, backend="cuda")
    with pytest.raises(ValueError, match="max_query_len"):
        paged_attention(*args, max_query_len=-1)
    with pytest.raises(ValueError, match="out must be"):
        paged_attention(*args, out=torch.empty_like(args[0]).half())
    if NUMBA_OK:
        half = [t.half() if t.is_floating_point() else t for t in args[:6]]
        with pytest.raises(ValueError, match="backend='numba' needs float32"):
            paged_attention(*half, args[6], backend="numba")
    q, k_cache, _, tables, seq_lens, qsl, _ = args
    with pytest.raises(ValueError, match="head_dim in"):
        big = torch.randn(*k_cache.shape[:3], 80, device=k_cache.device)
        paged_attention(q.new_empty(q.shape[0], 4, 80), big, big, tables, seq_lens, qsl, 0.1,
                        backend="triton")  # fmt: skip


def test_write_kv_errors():
    k, v, k_cache, v_cache, slots, _, _ = _write_kv_case(torch.float32)
    with pytest.raises(ValueError, match="slot_mapping must be int64"):
        write_kv(k, v, k_cache, v_cache, slots.int())
    with pytest.raises(ValueError, match="dtypes must match"):
        write_kv(k.half(), v.half(), k_cache, v_cache, slots)
    with pytest.raises(ValueError, match="per slot"):
        write_kv(k[:, :2], v[:, :2], k_cache, v_cache, slots)


# Batch-invariant attention: the CPU kernel, and the Triton kernel at its pinned tiles.
INVARIANT_BACKENDS = [
    pytest.param("torch", marks=pytest.mark.skipif(not NUMBA_OK, reason="needs Numba")),
    pytest.param("triton", marks=needs_triton),
]


def invariant_attention(case, backend, max_query_len=None):
    q, k_cache, v_cache, tables, seq_lens, qsl = case
    out = torch.full_like(q, float("nan"))  # poisoned
    paged_attention(
        q, k_cache, v_cache, tables, seq_lens, qsl, q.shape[-1] ** -0.5, out=out,
        max_query_len=max_query_len, backend=backend, batch_invariant=True,
    )  # fmt: skip
    return out


@pytest.mark.parametrize("backend", INVARIANT_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_batch_invariant_attention_matches_reference(scenario, dtype, backend):
    seqs, max_query_len = SCENARIOS[scenario]
    case = make_case(seqs, 6, 2, 32, 16, dtype, pad_tokens=3)
    q, k_cache, v_cache, tables, seq_lens, qsl = case
    out = invariant_attention(case, backend, max_query_len)
    n = int(qsl[-1])
    assert torch.isnan(out[n:]).all(), "padding rows past query_start_loc[-1] were written"
    ref = reference_paged_attention(q, k_cache, v_cache, tables, seq_lens, qsl, q.shape[-1] ** -0.5)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out[:n].double().cpu(), ref[:n], atol=atol, rtol=rtol)


# The Triton kernel is invariant by construction on a GPU (pinned tiles, no split-K) but is not
# checked bit for bit here: under the interpreter, whose tl.dot / tl.exp2 / tl.sum are numpy
# ops, a row changed in its last bit (2.4e-7) with the rows that shared its query tile.
@pytest.mark.skipif(not NUMBA_OK, reason="needs Numba")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_batch_invariant_attention_gives_a_query_the_same_bits_in_any_step(dtype):
    """One sequence of 40 tokens: its queries computed as one prefill, as chunks after cached
    keys, one decode at a time, and next to other sequences give identical rows."""
    backend = "torch"
    length, heads, kv_heads, dim, block = 40, 6, 2, 32, 16
    q_all, k_cache, v_cache, tables, _, _ = make_case([(length, length)], heads, kv_heads, dim, block, dtype)
    table = tables[:1]

    def step(first: int, last: int, neighbours: int = 0) -> torch.Tensor:
        """Queries first..last-1 of the sequence (its keys 0..last-1 cached), after ``neighbours``
        decode rows of other sequences that read the same blocks."""
        q = torch.cat([q_all[:neighbours] * 0.5, q_all[first:last]])
        lens = torch.tensor(
            [length - 3 * i for i in range(neighbours)] + [last], dtype=torch.int32, device=DEVICE
        )
        starts = torch.tensor(
            [*range(neighbours + 1), neighbours + last - first], dtype=torch.int32, device=DEVICE
        )
        step_tables = table.repeat(neighbours + 1, 1)
        case = (q, k_cache, v_cache, step_tables, lens, starts)
        return invariant_attention(case, backend, max(1, last - first))[neighbours:]

    whole = step(0, length)
    chunked = torch.cat([step(0, 13), step(13, 29, neighbours=2), step(29, length, neighbours=5)])
    decoded = torch.cat([step(p, p + 1, neighbours=p % 4) for p in range(length)])
    assert torch.equal(chunked, whole)
    assert torch.equal(decoded, whole)
