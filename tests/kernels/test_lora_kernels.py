"""Multi-LoRA shrink/expand: Triton (interpreter on CPU) and torch paths vs a float64 reference."""

from __future__ import annotations

import os
import sys
import zlib
from dataclasses import dataclass, replace

# The Triton kernels run on the CPU under the interpreter; tests/kernels/conftest.py sets
# this before triton is imported; set it here too when this module is run alone.
if "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from multilora_studio.kernels import (
    LoRABatch,
    LoRAPlan,
    add_lora,
    build_lora_batch,
    lora_cpu,
    lora_expand,
    lora_expand_shrunk_in_gemm,
    lora_shrink,
    reference_lora,
    reference_shrink,
)
from multilora_studio.kernels.lora_rows import RowTerms, apply_row_terms
from tests.kernels.device import DEVICE, TRITON_OK
from tests.kernels.grid import INTERPRETED, grid

NEEDS_TRITON = pytest.mark.skipif(not TRITON_OK, reason="needs Triton")
# "triton" takes the token-major (BGMV) kernels up to LoRAPlan.bgmv_max_tokens tokens and the
# slot-grouped (SGMV) ones above; "triton-grouped" forces the slot-grouped kernels.
NUMBA_OK = lora_cpu.AVAILABLE and DEVICE == "cpu"
NEEDS_NUMBA = pytest.mark.skipif(not NUMBA_OK, reason="needs Numba and CPU tensors")
BACKENDS = [
    pytest.param("triton", marks=NEEDS_TRITON, id="triton"),
    pytest.param("triton", marks=[NEEDS_TRITON, pytest.mark.grouped_kernels], id="triton-grouped"),
    "torch",
    pytest.param("numba", marks=NEEDS_NUMBA, id="numba"),  # add_lora in float32; shrink/expand run as torch
]
TRITON_PATHS = BACKENDS[:2]
NUMBA = BACKENDS[3]

# ||out - ref|| / ||ref|| against the float64 reference, per dtype. bf16/fp16 round the
# rank-r intermediate to the weight dtype before expand (as the GPU kernel does) and y's sum.
TOL = {torch.float32: 2e-5, torch.bfloat16: 1.5e-2, torch.float16: 2e-3}
DTYPES = list(TOL)

NUM_SLOTS = 6
# Ranks 4..64 mixed in one batch; the last slot is empty.
RANKS = [4, 8, 16, 64, 32, 0]
MAX_RANK = 64
# (in_features, slice widths): q/k/v with GQA (a slice wider than one 128-column tile),
# gate/up, one slice.
SHAPES = {
    "qkv": (80, (144, 48, 48)),
    "gate_up": (72, (96, 96)),
    "single": (40, (56,)),
}
# skewed (punica's): one token of one adapter beside a long run of another, so the kernels'
# segments and tiles are as unequal as they get
PATTERNS = ["distinct", "uniform", "zipf", "identical", "all_none", "base_mixed", "skewed"]


@pytest.fixture(autouse=True)
def _numba_computes_float32_only(request):
    params = getattr(request.node, "callspec", None)
    params = params.params if params is not None else {}
    if (
        params.get("backend") == "numba"
        and params.get("dtype", torch.float32) != torch.float32
        and request.node.originalname == "test_add_lora_matches_reference"
    ):
        pytest.skip("the numba backend computes float32 only (test_numba_refuses_other_dtypes)")


def plan_for(backend: str, grouped: bool = False) -> LoRAPlan | None:
    """The plan a test's ``backend`` names: None for "auto" (the wrappers' own choice), the
    Numba kernel at every token count for "numba", and for "triton" the shipped dispatch or,
    with ``grouped``, the slot-grouped kernels at every token count."""
    if backend == "auto":
        return None
    if backend == "triton":
        shipped = LoRAPlan.for_device(DEVICE)
        return replace(shipped, backend="triton", bgmv_max_tokens=0 if grouped else shipped.bgmv_max_tokens)
    if backend == "numba":
        return LoRAPlan(backend="numba", numba_max_tokens=1 << 20)
    return LoRAPlan(backend=backend)


@pytest.fixture
def plan(request, backend):
    """The plan of the test's ``backend`` parameter (and its grouped_kernels mark)."""
    return plan_for(backend, grouped=request.node.get_closest_marker("grouped_kernels") is not None)


def seed_of(*parts: object) -> int:
    return zlib.crc32(repr(parts).encode())


@dataclass
class Case:
    x: torch.Tensor  # [T, K]
    lora_a: torch.Tensor  # [L, S, R, K]
    lora_b: torch.Tensor  # [L, N, R]
    slot_ids: torch.Tensor  # [T] int32
    slot_ranks: torch.Tensor  # [L] int32
    offsets: tuple[int, ...]
    y: torch.Tensor  # [T, N], poisoned in rows without an adapter

    @property
    def batch(self) -> LoRABatch:
        return build_lora_batch(self.slot_ids, self.slot_ranks, NUM_SLOTS)


def make_slots(pattern: str, num_tokens: int, gen: torch.Generator) -> torch.Tensor:
    active = [i for i, r in enumerate(RANKS) if r > 0]
    if pattern == "distinct":
        perm = torch.tensor(active)[torch.randperm(len(active), generator=gen)]
        slots = perm[torch.arange(num_tokens) % len(active)]
    elif pattern == "uniform":
        slots = torch.tensor(active)[torch.randint(0, len(active), (num_tokens,), generator=gen)]
    elif pattern == "zipf":
        p = 1.0 / torch.arange(1, len(active) + 1, dtype=torch.float64) ** 1.5
        pick = torch.multinomial(p, num_tokens, replacement=True, generator=gen)
        slots = torch.tensor(active)[pick]
    elif pattern == "identical":
        slots = torch.full((num_tokens,), active[torch.randint(0, len(active), (1,), generator=gen)])
    elif pattern == "all_none":
        slots = torch.full((num_tokens,), -1)
    elif pattern == "base_mixed":
        slots = torch.tensor(active)[torch.randint(0, len(active), (num_tokens,), generator=gen)]
        slots[torch.rand(num_tokens, generator=gen) < 0.35] = -1
        slots[0] = -1
    elif pattern == "skewed":
        one, run = torch.tensor(active)[torch.randperm(len(active), generator=gen)[:2]]
        slots = torch.full((num_tokens,), int(run))
        slots[torch.randint(0, num_tokens, (1,), generator=gen)] = int(one)
    else:
        raise AssertionError(pattern)
    return slots.to(torch.int32)


def poison_rows(y: torch.Tensor, rows: torch.Tensor, gen: torch.Generator) -> None:
    """Rows that must stay untouched get NaN, -0.0 and large values (bitwise checked)."""
    if not rows.any():
        return
    p = (torch.randn(int(rows.sum()), y.shape[1], generator=gen) * 1e4).to(y.dtype)
    p[:, ::3] = float("nan")  # set in y's dtype: a round trip through float32 changes the bits
    p[:, 1::3] = -0.0
    y[rows] = p.to(y.device)


def make_case(
    dtype: torch.dtype,
    num_tokens: int,
    shape: str,
    pattern: str,
    gen: torch.Generator,
    pad: float = 0.0,
) -> Case:
    """Random problem; weights beyond each slot's rank hold ``pad`` (0 per the layout)."""
    in_features, widths = SHAPES[shape]
    offsets = (0, *torch.tensor(widths).cumsum(0).tolist())
    num_slices, out_total = len(widths), offsets[-1]
    # Scales keep the LoRA term around 1 so relative errors are meaningful.
    lora_a = torch.randn(NUM_SLOTS, num_slices, MAX_RANK, in_features, generator=gen)
    lora_a /= in_features**0.5
    lora_b = torch.randn(NUM_SLOTS, out_total, MAX_RANK, generator=gen) / 4.0
    for slot, rank in enumerate(RANKS):
        lora_a[slot, :, rank:] = pad
        lora_b[slot, :, rank:] = pad
    slot_ids = make_slots(pattern, num_tokens, gen)
    y = torch.randn(num_tokens, out_total, generator=gen).to(dtype)
    poison_rows(y, slot_ids < 0, gen)
    return Case(
        x=torch.randn(num_tokens, in_features, generator=gen).to(dtype).to(DEVICE),
        lora_a=lora_a.to(dtype).to(DEVICE),
        lora_b=lora_b.to(dtype).to(DEVICE),
        slot_ids=slot_ids.to(DEVICE),
        slot_ranks=torch.tensor(RANKS, dtype=torch.int32, device=DEVICE),
        offsets=offsets,
        y=y.to(DEVICE),
    )


def zero_padded(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    a, b = case.lora_a.clone(), case.lora_b.clone()
    for slot, rank in enumerate(RANKS):
        a[slot, :, rank:] = 0
        b[slot, :, rank:] = 0
    return a, b


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def check_y(out: torch.Tensor, case: Case, dtype: torch.dtype, a=None, b=None) -> None:
    a = case.lora_a if a is None else a
    b = case.lora_b if b is None else b
    ref = reference_lora(case.y, case.x, a, b, case.slot_ids, case.offsets)
    untouched = case.slot_ids < 0
    # Rows without an adapter: bit for bit what they were (NaN, -0.0 and large values).
    assert torch.equal(out[untouched].view(torch.int8), case.y[untouched].view(torch.int8))
    written = ~untouched
    if written.any():
        got = out[written]
        assert torch.isfinite(got).all()
        err = rel_err(got, ref[written])
        assert err < TOL[dtype], f"relative error {err:.3e} over {TOL[dtype]:.1e}"


# --------------------------------------------------------------------------- correctness


def on_triton(backend: str, *_: object) -> bool:
    """Whether a case's kernels run in Triton (the interpreter, on the CPU): grid's predicate.
    Under the interpreter the Triton cases below are a covering subset of the grid
    (tests/kernels/grid.py): every dtype with every pattern here, each pattern once in the
    fused tests; natively (a GPU host) every combination."""
    return backend == "triton"


@pytest.mark.parametrize(
    ("backend", "dtype", "pattern", "num_tokens"),
    grid(BACKENDS, DTYPES, PATTERNS, [1, 7, 33], interpreted=on_triton),
)
def test_add_lora_matches_reference(backend, plan, dtype, pattern, num_tokens):
    shape = ["qkv", "gate_up", "single"][num_tokens % 3]
    gen = torch.Generator().manual_seed(seed_of(backend, dtype, pattern, num_tokens))
    case = make_case(dtype, num_tokens, shape, pattern, gen)
    y = case.y.clone()
    out = add_lora(y, case.x, case.lora_a, case.lora_b, case.batch, case.offsets, plan=plan)
    assert out is y
    check_y(y, case, dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("pattern", ["uniform", "base_mixed", "identical"])
def test_shrink_then_expand(backend, plan, dtype, pattern):
    gen = torch.Generator().manual_seed(seed_of("se", backend, dtype, pattern))
    case = make_case(dtype, 13, "qkv", pattern, gen)
    batch = case.batch
    num_slices = len(case.offsets) - 1
    out = torch.full((num_slices, 13, MAX_RANK), float("nan"), device=DEVICE)
    buf = lora_shrink(case.x, case.lora_a, batch, out=out, plan=plan)
    assert buf is out
    ref = reference_shrink(case.x, case.lora_a, case.slot_ids)  # [S, T, R]
    # Entries that must be written: tokens with an adapter, ranks below the slot's rank.
    ranks = case.slot_ranks[case.slot_ids.clamp_min(0).long()]  # [T]
    must = (case.slot_ids >= 0)[:, None] & (torch.arange(MAX_RANK, device=DEVICE) < ranks[:, None])
    must = must.expand_as(buf)
    assert torch.isfinite(buf[must]).all()
    if must.any():
        assert rel_err(buf[must], ref[must]) < TOL[torch.float32]
    y = case.y.clone()
    assert lora_expand(y, buf, case.lora_b, batch, case.offsets, plan=plan) is y
    check_y(y, case, dtype)
    # Without out=: a fresh buffer, same values where defined.
    buf2 = lora_shrink(case.x, case.lora_a, batch, plan=plan)
    assert buf2.dtype == torch.float32 and buf2.shape == buf.shape
    assert torch.equal(buf2[must], buf[must])


def gathered_shrink(case: Case, gen: torch.Generator) -> torch.Tensor:
    """The shrink against every slot, as the engine's GEMM over the base rows and every slot's
    A rows gives it ([T, L, S, R] in x's dtype, a strided view of one [T, N + L*S*R] output),
    with NaN in every entry a token must not read: other slots' rows and ranks at or beyond
    its own slot's rank."""
    num_tokens, num_slices = case.x.shape[0], len(case.offsets) - 1
    out_total = case.offsets[-1]
    a_rows = case.lora_a.reshape(NUM_SLOTS * num_slices * MAX_RANK, -1)  # [L*S*R, K]
    out = torch.empty(num_tokens, out_total + a_rows.shape[0], dtype=case.x.dtype, device=DEVICE)
    out[:, out_total:] = case.x @ a_rows.T
    shrunk = out[:, out_total:].view(num_tokens, NUM_SLOTS, num_slices, MAX_RANK)
    own = torch.zeros(num_tokens, NUM_SLOTS, num_slices, MAX_RANK, dtype=torch.bool, device=DEVICE)
    for t, slot in enumerate(case.slot_ids.tolist()):
        if slot >= 0:
            own[t, slot, :, : RANKS[slot]] = True
    shrunk.masked_fill_(~own, float("nan"))
    return shrunk


@pytest.mark.parametrize(
    ("backend", "dtype", "pattern", "num_tokens"),
    grid(["triton", "torch"], DTYPES, PATTERNS, [1, 7, 33], interpreted=on_triton),
)
def test_expand_shrunk_in_gemm_matches_reference(backend, plan, dtype, pattern, num_tokens):
    if backend == "triton" and not TRITON_OK:
        pytest.skip("needs Triton")
    shape = ["qkv", "gate_up", "single"][num_tokens % 3]
    gen = torch.Generator().manual_seed(seed_of("gathered", backend, dtype, pattern, num_tokens))
    case = make_case(dtype, num_tokens, shape, pattern, gen)
    shrunk = gathered_shrink(case, gen)
    y = torch.empty(num_tokens, case.offsets[-1] + 8, dtype=dtype, device=DEVICE)[:, 4:-4]
    y.copy_(case.y)  # strided rows, as the GEMM output's view is
    out = lora_expand_shrunk_in_gemm(y, shrunk, case.lora_b, case.batch, case.offsets, plan=plan)
    assert out is y
    check_y(y, case, dtype)


@NEEDS_TRITON
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pattern", ["base_mixed", "identical", "zipf"])
def test_expand_shrunk_in_gemm_above_the_decode_kernels_runs_slot_grouped(dtype, pattern):
    """Above ``bgmv_max_tokens`` the slot-grouped expand reads each token's own slot's row of
    the GEMM's shrink (strided rows, NaN in every other slot's entries) and the torch path
    (the gather) agrees with it."""
    plan = replace(plan_for("triton"), bgmv_max_tokens=4)  # 37 tokens: the slot-grouped kernel
    gen = torch.Generator().manual_seed(seed_of("gathered-large", dtype, pattern))
    case = make_case(dtype, 37, "qkv", pattern, gen)
    shrunk = gathered_shrink(case, gen)
    for path in (plan, LoRAPlan()):
        y = torch.empty(37, case.offsets[-1] + 8, dtype=dtype, device=DEVICE)[:, 4:-4]
        y.copy_(case.y)  # strided rows, as the GEMM output's view is
        lora_expand_shrunk_in_gemm(y, shrunk, case.lora_b, case.batch, case.offsets, path)
        check_y(y, case, dtype)


def test_expand_shrunk_in_gemm_rejects_bad_input():
    case = small_case()
    gen = torch.Generator().manual_seed(1)
    shrunk = gathered_shrink(case, gen)
    with pytest.raises(ValueError, match="shrunk must be a float tensor"):
        lora_expand_shrunk_in_gemm(case.y, shrunk[0], case.lora_b, case.batch, case.offsets)
    with pytest.raises(ValueError, match="shrunk has 2 slots"):
        lora_expand_shrunk_in_gemm(case.y, shrunk[:, :2], case.lora_b, case.batch, case.offsets)
    with pytest.raises(ValueError, match="tokens but y has"):
        lora_expand_shrunk_in_gemm(case.y[:-1], shrunk, case.lora_b, case.batch, case.offsets)
    with pytest.raises(ValueError, match="num_slices"):
        lora_expand_shrunk_in_gemm(case.y, shrunk[:, :, :2], case.lora_b, case.batch, case.offsets)


@pytest.mark.parametrize("backend", BACKENDS)
def test_prefill_groups(backend, plan):
    """A prefill-like step: long runs of one adapter, a scattered adapter, base rows."""
    gen = torch.Generator().manual_seed(seed_of("prefill", backend))
    dtype = torch.float32 if backend == "numba" else torch.bfloat16
    case = make_case(dtype, 150, "gate_up", "uniform", gen)
    slots = torch.full((150,), 1, dtype=torch.int32)
    slots[40:100] = 3
    slots[100:] = -1
    slots[100::7] = 0
    slots[5] = 4
    case.slot_ids = slots.to(DEVICE)
    case.y = torch.randn(150, case.offsets[-1], generator=gen).to(dtype).to(DEVICE)
    poison_rows(case.y, case.slot_ids < 0, gen)
    y = case.y.clone()
    add_lora(y, case.x, case.lora_a, case.lora_b, case.batch, case.offsets, plan=plan)
    check_y(y, case, dtype)


@pytest.mark.parametrize("stacked_max", [0, 64])
@pytest.mark.parametrize("pattern", ["distinct", "base_mixed", "zipf"])
def test_torch_paths(stacked_max, pattern):
    """The torch backend's per-adapter and stacked (decode) paths agree with the reference."""
    plan = LoRAPlan(backend="torch", stacked_max_tokens=stacked_max)
    gen = torch.Generator().manual_seed(seed_of("paths", stacked_max, pattern))
    for dtype in DTYPES:
        case = make_case(dtype, 9, "qkv", pattern, gen)
        y = case.y.clone()
        add_lora(y, case.x, case.lora_a, case.lora_b, case.batch, case.offsets, plan)
        check_y(y, case, dtype)


@pytest.mark.parametrize("backend", [*TRITON_PATHS, NUMBA])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernels_never_read_rank_padding(backend, plan, dtype):
    """NaN beyond each slot's rank (and in the empty slot) must not reach the output."""
    if backend == "numba" and dtype != torch.float32:
        pytest.skip("float32 only")
    gen = torch.Generator().manual_seed(seed_of("pad", dtype))
    case = make_case(dtype, 21, "qkv", "uniform", gen, pad=float("nan"))
    case.slot_ids[::4] = 5  # tokens on the empty slot: untouched
    case.y = torch.randn(21, case.offsets[-1], generator=gen).to(dtype).to(DEVICE)
    poison_rows(case.y, case.slot_ids == 5, gen)
    y = case.y.clone()
    add_lora(y, case.x, case.lora_a, case.lora_b, case.batch, case.offsets, plan=plan)
    a, b = zero_padded(case)
    empty = case.slot_ids == 5
    assert torch.equal(y[empty].view(torch.int8), case.y[empty].view(torch.int8))
    ref = reference_lora(case.y, case.x, a, b, case.slot_ids, case.offsets)
    assert rel_err(y[~empty], ref[~empty]) < TOL[dtype]


@pytest.mark.skipif(not TRITON_OK, reason="needs Triton")
@pytest.mark.parametrize("split_k", [1, 3])
def test_triton_split_k_and_tiles(split_k):
    """Split-K partials (in_features not a multiple of the split) and explicit tile shapes."""
    from multilora_studio.kernels import lora_sgmv

    gen = torch.Generator().manual_seed(seed_of("split", split_k))
    dtype = torch.float16
    for pattern in ("zipf", "base_mixed"):
        case = make_case(dtype, 19, "qkv", pattern, gen)
        batch = case.batch
        scfg = lora_sgmv.ShrinkConfig(block_m=16, block_n=32, block_k=16, split_k=split_k)
        part = lora_sgmv.shrink_partials(case.x, case.lora_a, batch, config=scfg)
        assert part.shape[0] == split_k
        y = case.y.clone()
        ecfg = lora_sgmv.ExpandConfig(block_m=16, block_n=32)
        lora_sgmv.expand(y, part, case.lora_b, batch, case.offsets, config=ecfg)
        check_y(y, case, dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_contiguous_inputs(backend, plan):
    """Column slices and transposed storage for x, lora_a, lora_b and y are handled."""
    gen = torch.Generator().manual_seed(seed_of("strides", backend))
    dtype = torch.float32
    case = make_case(dtype, 11, "qkv", "base_mixed", gen)
    t, k = case.x.shape
    x_t = torch.randn(k, t, generator=gen).to(DEVICE)
    x_t.copy_(case.x.T)
    x = x_t.T  # strides (1, T)
    wide_a = torch.randn(*case.lora_a.shape[:3], k + 8, generator=gen).to(DEVICE)
    wide_a[..., 3 : 3 + k] = case.lora_a
    lora_a = wide_a[..., 3 : 3 + k]
    lora_b = case.lora_b.transpose(1, 2).contiguous().transpose(1, 2)  # rank-major storage
    n = case.offsets[-1]
    wide_y = torch.randn(t, n + 16, generator=gen).to(DEVICE)
    wide_y[:, 5 : 5 + n] = case.y
    y = wide_y[:, 5 : 5 + n]
    assert not x.is_contiguous() and not lora_a.is_contiguous() and not y.is_contiguous()
    add_lora(y, x, lora_a, lora_b, case.batch, case.offsets, plan=plan)
    check_y(y, case, dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_reuse_and_short_x(backend, plan):
    """One allocated batch refilled in place; an x shorter than the last update."""
    gen = torch.Generator().manual_seed(seed_of("reuse", backend))
    dtype = torch.float32
    batch = LoRABatch.allocate(64, NUM_SLOTS, DEVICE)
    for num_tokens in (33, 5, 17):
        case = make_case(dtype, num_tokens, "single", "uniform", gen)
        batch.update(case.slot_ids, case.slot_ranks)
        y = case.y.clone()
        add_lora(y, case.x, case.lora_a, case.lora_b, batch, case.offsets, plan=plan)
        check_y(y, case, dtype)
    # Rows past x's length are ignored even though the batch holds more tokens.
    case = make_case(dtype, 9, "single", "distinct", gen)
    batch.update(torch.cat([case.slot_ids, case.slot_ids]), case.slot_ranks)
    y = case.y.clone()
    add_lora(y, case.x, case.lora_a, case.lora_b, batch, case.offsets, plan=plan)
    check_y(y, case, dtype)


def test_batch_metadata():
    batch = LoRABatch.allocate(16, 4, "cpu")
    slots = torch.tensor([2, -1, 0, 2, 7, 0, 2], dtype=torch.int32)
    ranks = torch.tensor([8, 0, 16, 4], dtype=torch.int32)
    batch.update(slots, ranks)
    expect_slots = [2, -1, 0, 2, -1, 0, 2] + [-1] * 9  # 7 is out of range: no adapter
    assert batch.token_slots.tolist() == expect_slots
    assert batch.slot_counts.tolist() == [2, 0, 3, 0]
    assert batch.slot_starts.tolist() == [0, 2, 2, 5]
    assert batch.sorted_tokens[:5].tolist() == [2, 5, 0, 3, 6]
    assert sorted(batch.sorted_tokens.tolist()) == list(range(16))
    assert batch.slot_ranks.tolist() == [8, 0, 16, 4]
    assert batch.token_ranks.tolist() == [16, 0, 8, 16, 0, 8, 16] + [0] * 9
    assert batch.num_tokens.tolist() == [7]
    buffers = (batch.token_slots, batch.token_ranks, batch.sorted_tokens, batch.slot_starts)
    assert all(t.dtype == torch.int32 for t in buffers)
    batch.update(torch.tensor([3], dtype=torch.int64), ranks)
    assert batch.slot_counts.tolist() == [0, 0, 0, 1]
    assert batch.token_slots[:2].tolist() == [3, -1]
    assert batch.token_ranks[:2].tolist() == [4, 0]


@pytest.mark.skipif(DEVICE != "cpu", reason="CPU tensors only")
@pytest.mark.parametrize(
    ("dtype", "num_tokens", "expected"),
    [
        (torch.float32, 6, "numba"),
        (torch.float32, LoRAPlan().numba_max_tokens, "numba"),
        (torch.float32, LoRAPlan().numba_max_tokens + 1, "torch"),
        (torch.bfloat16, 6, "torch"),
    ],
    ids=str,
)
def test_auto_backend_on_cpu(dtype, num_tokens, expected):
    """auto on the CPU: the numba kernel for small float32 batches, torch ops otherwise."""
    if expected == "numba" and not lora_cpu.AVAILABLE:
        pytest.skip("needs Numba")
    gen = torch.Generator().manual_seed(seed_of("auto", dtype, num_tokens))
    case = make_case(dtype, num_tokens, "gate_up", "uniform", gen)
    y1, y2 = case.y.clone(), case.y.clone()
    add_lora(y1, case.x, case.lora_a, case.lora_b, case.batch, case.offsets, plan_for(expected))
    add_lora(y2, case.x, case.lora_a, case.lora_b, case.batch, case.offsets)
    assert torch.equal(y1.view(torch.int8), y2.view(torch.int8))
    check_y(y2, case, dtype)


@NEEDS_NUMBA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_numba_refuses_other_dtypes(dtype):
    gen = torch.Generator().manual_seed(seed_of("numba-dtype", dtype))
    case = make_case(dtype, 5, "qkv", "uniform", gen)
    y = case.y.clone()
    with pytest.raises(ValueError, match="float32 only"):
        add_lora(y, case.x, case.lora_a, case.lora_b, case.batch, case.offsets, plan_for("numba"))
    assert torch.equal(y.view(torch.int8), case.y.view(torch.int8))


@NEEDS_NUMBA
@pytest.mark.parametrize("pattern", PATTERNS)
def test_numba_engine_layout(pattern):
    """The engine's CPU slot layout: B stored rank-major, handed over as a transposed view."""
    gen = torch.Generator().manual_seed(seed_of("numba-layout", pattern))
    case = make_case(torch.float32, 19, "qkv", pattern, gen)
    lora_b = case.lora_b.transpose(1, 2).contiguous().transpose(1, 2)  # [slots, N, R] over [slots, R, N]
    assert lora_b.stride(1) == 1
    batch = LoRABatch.allocate(32, NUM_SLOTS, DEVICE)
    batch.update(case.slot_ids, case.slot_ranks)
    y = case.y.clone()
    add_lora(y, case.x, case.lora_a, lora_b, batch, case.offsets, plan_for("numba"), validate=False)
    check_y(y, case, torch.float32)


# ------------------------------------------------------------------------------- errors


def small_case() -> Case:
    gen = torch.Generator().manual_seed(seed_of("errors"))
    return make_case(torch.float32, 5, "qkv", "uniform", gen)


@pytest.mark.parametrize("backend", ["torch", "triton", "auto", "numba"])
@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda c: {"x": c.x[:, :-1]}, "in_features"),
        (lambda c: {"x": c.x.to(torch.float16)}, "dtype"),
        (lambda c: {"x": c.x.to(torch.int32)}, "float32, bfloat16 or float16"),
        (lambda c: {"x": c.x[None]}, "dims"),
        (lambda c: {"lora_a": c.lora_a[:-1]}, "slots"),
        (lambda c: {"lora_a": c.lora_a.to("meta")}, "device"),
        (lambda c: {"lora_b": c.lora_b[:, :-1]}, "out_total"),
        (lambda c: {"lora_b": c.lora_b[:, :, :-1]}, "max_rank"),
        (lambda c: {"lora_b": c.lora_b.to(torch.bfloat16)}, "dtype"),
        (lambda c: {"y": c.y[:-1]}, "tokens"),
        (lambda c: {"y": c.y.to(torch.float16)}, "dtype"),
        (lambda c: {"y": torch.zeros(1, c.y.shape[1], device=c.y.device).expand_as(c.y)}, "zero strides"),
        (lambda c: {"offsets": c.offsets[:-1]}, r"num_slices \+ 1"),
        (lambda c: {"offsets": (0, 150, 140, c.offsets[-1])}, "non-decreasing"),
        (lambda c: {"offsets": (1, *c.offsets[1:])}, "start at 0"),
        (lambda c: {"offsets": torch.tensor(c.offsets)}, "tuple of ints"),
        (lambda c: {"batch": LoRABatch.allocate(2, NUM_SLOTS, DEVICE)}, "max_tokens"),
        (lambda c: {"batch": "not a batch"}, "LoRABatch"),
        (lambda c: {"backend": "cuda"}, "backend"),
    ],
)
def test_add_lora_rejects_bad_input(backend, mutate, message):
    if backend == "triton" and not TRITON_OK:
        pytest.skip("needs Triton")
    if backend == "numba" and not NUMBA_OK:
        pytest.skip("needs Numba and CPU tensors")
    case = small_case()
    args = {
        "y": case.y.clone(),
        "x": case.x,
        "lora_a": case.lora_a,
        "lora_b": case.lora_b,
        "batch": case.batch,
        "offsets": case.offsets,
        "backend": backend,
    }
    args.update(mutate(case))
    with pytest.raises(ValueError, match=message):
        add_lora(
            args["y"],
            args["x"],
            args["lora_a"],
            args["lora_b"],
            args["batch"],
            args["offsets"],
            plan_for(args["backend"]),  # an unknown backend is refused by the plan
        )


def test_shrink_expand_reject_bad_input():
    case = small_case()
    batch = case.batch
    buf = lora_shrink(case.x, case.lora_a, batch)
    with pytest.raises(ValueError, match="out must have shape"):
        lora_shrink(case.x, case.lora_a, batch, out=torch.empty(1, 2, 3))
    with pytest.raises(ValueError, match="float32"):
        lora_shrink(case.x, case.lora_a, batch, out=buf.half())
    with pytest.raises(ValueError, match="buf must be a float32"):
        lora_expand(case.y, buf.half(), case.lora_b, batch, case.offsets)
    with pytest.raises(ValueError, match="tokens"):
        lora_expand(case.y[:-1], buf, case.lora_b, batch, case.offsets)
    with pytest.raises(ValueError, match="num_slices"):
        lora_expand(case.y, buf[:2], case.lora_b, batch, case.offsets)


def test_batch_rejects_bad_input():
    with pytest.raises(ValueError, match="max_tokens"):
        LoRABatch.allocate(0, 4)
    with pytest.raises(ValueError, match="num_slots"):
        LoRABatch.allocate(4, 0)
    batch = LoRABatch.allocate(4, 3)
    ranks = torch.zeros(3, dtype=torch.int32)
    with pytest.raises(ValueError, match="exceed"):
        batch.update(torch.zeros(5, dtype=torch.int32), ranks)
    with pytest.raises(ValueError, match="1-D"):
        batch.update(torch.zeros(2, 2, dtype=torch.int32), ranks)
    with pytest.raises(ValueError, match="int32 or int64"):
        batch.update(torch.zeros(2), ranks)
    with pytest.raises(ValueError, match="slot_ranks"):
        batch.update(torch.zeros(2, dtype=torch.int32), torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="device"):
        batch.update(torch.zeros(2, dtype=torch.int32, device="meta"), ranks)
    with pytest.raises(ValueError, match="1-D"):
        build_lora_batch(torch.zeros(2, 2, dtype=torch.int32), ranks, 3)


@pytest.mark.skipif(not TRITON_OK, reason="needs Triton")
@pytest.mark.parametrize(("block_k", "block_n"), [(16, 32), (32, 64), (128, 16)])
def test_token_major_kernels_tiles(block_k, block_n):
    """Token-major kernels with explicit tiles: several K chunks (one uneven), narrow B tiles."""
    from multilora_studio.kernels import lora_bgmv

    plan = plan_for("triton")
    gen = torch.Generator().manual_seed(seed_of("decode-tiles", block_k, block_n))
    num_tokens = 7 if INTERPRETED else 19  # the tiles are what is tested; each token is a program
    for dtype, pattern in ((torch.float16, "zipf"), (torch.float32, "base_mixed")):
        case = make_case(dtype, num_tokens, "qkv", pattern, gen)
        batch = case.batch
        part = lora_bgmv.shrink_partials(case.x, case.lora_a, batch, plan, block_k=block_k)
        assert part.shape[0] == -(-case.x.shape[1] // block_k)
        y = case.y.clone()
        lora_bgmv.expand(y, part, case.lora_b, batch, case.offsets, plan, block_n=block_n)
        check_y(y, case, dtype)


def test_programmatic_dependent_launch_only_on_capable_gpus():
    from multilora_studio.kernels.triton_support import HAVE_GDC, interpreting, pdl_supported

    assert not pdl_supported(torch.device("cpu"))
    assert not LoRAPlan.for_device(torch.device("cpu")).pdl
    if torch.cuda.is_available():
        capable = torch.cuda.get_device_capability()[0] >= 9 and HAVE_GDC and not interpreting()
        assert LoRAPlan.for_device(torch.device("cuda")).pdl == capable


@pytest.mark.parametrize("backend", TRITON_PATHS)
def test_ranks_above_one_rank_block(backend, plan):
    """Ranks 96 and 128 (max_rank 128) loop over rank blocks; padding (NaN) is not used."""
    gen = torch.Generator().manual_seed(seed_of("big-rank", backend))
    ranks, max_rank, in_features = [96, 128, 20], 128, 48
    offsets = (0, 40, 64)  # two slices, 40 and 24 columns
    lora_a = torch.randn(3, 2, max_rank, in_features, generator=gen) / in_features**0.5
    lora_b = torch.randn(3, 64, max_rank, generator=gen) / 8.0
    for slot, rank in enumerate(ranks):
        lora_a[slot, :, rank:] = float("nan")
        lora_b[slot, :, rank:] = float("nan")
    slot_ids = torch.tensor([1, 0, -1, 2, 1, 0, 0], dtype=torch.int32)
    x = torch.randn(7, in_features, generator=gen)
    y = torch.randn(7, 64, generator=gen)
    rank_t = torch.tensor(ranks, dtype=torch.int32)
    batch = build_lora_batch(slot_ids.to(DEVICE), rank_t.to(DEVICE), 3)
    out = y.to(DEVICE).clone()
    add_lora(out, x.to(DEVICE), lora_a.to(DEVICE), lora_b.to(DEVICE), batch, offsets, plan=plan)
    clean_a, clean_b = lora_a.nan_to_num(0.0), lora_b.nan_to_num(0.0)
    ref = reference_lora(y, x, clean_a, clean_b, slot_ids, offsets)
    assert torch.equal(out[2].cpu(), y[2])
    assert rel_err(out.cpu(), ref) < TOL[torch.float32]


@pytest.mark.parametrize("backend", BACKENDS)
def test_unvalidated_call_computes_the_same(backend, plan):
    """validate=False (the engine's calls) skips only the checks: same bits as the checked call."""
    gen = torch.Generator().manual_seed(seed_of("unvalidated", backend))
    case = make_case(torch.float32, 9, "qkv", "base_mixed", gen)
    checked = add_lora(case.y.clone(), case.x, case.lora_a, case.lora_b, case.batch, case.offsets, plan=plan)
    unchecked = add_lora(
        case.y.clone(),
        case.x,
        case.lora_a,
        case.lora_b,
        case.batch,
        case.offsets,
        plan=plan,
        validate=False,
    )
    assert torch.equal(checked.view(torch.int8), unchecked.view(torch.int8))
    check_y(unchecked, case, torch.float32)


# ------------------------------------------------------- SiLU-and-mul with the gate/up expand

# (backend, expand tile): Triton with its own tile (one block a row at these widths) and with
# small tiles (several blocks a row), and the torch path
FUSED_PATHS = [
    pytest.param("triton", None, id="triton"),
    pytest.param("triton", 1024, id="triton-small-tiles"),
    pytest.param("torch", None, id="torch"),
]


@pytest.mark.parametrize(
    ("backend", "tile", "pattern", "dtype", "num_tokens"),
    grid(FUSED_PATHS, PATTERNS, DTYPES, [1, 19], interpreted=on_triton, full=1),
)
def test_silu_and_mul_lora_equals_expand_then_silu(tile, backend, dtype, pattern, num_tokens):
    from multilora_studio.kernels.fused_ops import silu_and_mul
    from multilora_studio.kernels.lora import silu_and_mul_lora

    if backend == "triton" and not TRITON_OK:
        pytest.skip("needs Triton")
    plan = plan_for(backend)
    # small tiles for the fused kernel only: 8 columns a block, 12 blocks of 96
    fused_plan = plan if tile is None else replace(plan, bgmv_expand_tile=tile)
    gen = torch.Generator().manual_seed(seed_of("silu-lora", backend, dtype, pattern, num_tokens))
    case = make_case(dtype, num_tokens, "gate_up", pattern, gen)
    shrunk = gathered_shrink(case, gen)
    gate_up = torch.empty(num_tokens, case.offsets[-1] + 8, dtype=dtype, device=DEVICE)[
        :, :-8
    ]  # strided rows
    gate_up.copy_(case.y)
    act = silu_and_mul_lora(gate_up.clone(), shrunk, case.lora_b, case.batch, fused_plan)
    # the two launches it replaces, on the same backend: equal bit for bit
    unfused = gate_up.clone()
    lora_expand_shrunk_in_gemm(unfused, shrunk, case.lora_b, case.batch, case.offsets, plan=plan)
    expected = silu_and_mul(unfused, backend="triton" if backend == "triton" else "torch")
    assert torch.equal(act.view(torch.int8), expected.view(torch.int8))
    # and against float64: silu(gate + lora) * (up + lora) on rows with an adapter
    written = case.slot_ids >= 0
    if written.any():
        ref = reference_lora(case.y, case.x, case.lora_a, case.lora_b, case.slot_ids, case.offsets)
        gate, up = ref[:, : case.offsets[1]], ref[:, case.offsets[1] :]
        ref_act = torch.nn.functional.silu(gate) * up
        err = rel_err(act[written], ref_act[written])
        assert err < 2 * TOL[dtype], f"relative error {err:.3e}"


def test_silu_and_mul_lora_rejects_bad_input():
    from multilora_studio.kernels.lora import silu_and_mul_lora

    gen = torch.Generator().manual_seed(seed_of("silu-errors"))
    case = make_case(torch.float32, 5, "gate_up", "uniform", gen)
    shrunk = gathered_shrink(case, gen)
    with pytest.raises(ValueError, match="gate_up must be"):
        silu_and_mul_lora(case.y[:, :-1], shrunk, case.lora_b, case.batch)
    with pytest.raises(ValueError, match="shrunk"):
        silu_and_mul_lora(case.y, shrunk[:, :, :1], case.lora_b, case.batch, plan_for("triton"))
    with pytest.raises(ValueError, match="lora_b must be"):
        silu_and_mul_lora(case.y, shrunk, case.lora_b[:, :-2], case.batch, plan_for("triton"))


# --------------------------------------------- residual-add + RMSNorm with the o / down expand

NORM_RTOL = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}  # about one ulp


@pytest.mark.parametrize(
    ("backend", "tile", "pattern", "dtype", "num_tokens"),
    grid(FUSED_PATHS, PATTERNS, DTYPES, [1, 19], interpreted=on_triton, full=1),
)
def test_add_rms_norm_lora_equals_expand_then_norm(tile, backend, dtype, pattern, num_tokens):
    from multilora_studio.kernels.fused_ops import add_rms_norm
    from multilora_studio.kernels.lora import add_rms_norm_lora

    if backend == "triton" and not TRITON_OK:
        pytest.skip("needs Triton")
    plan = plan_for(backend)
    # small tiles for the fused kernel only: 16 columns a block, 4 blocks of 56
    fused_plan = plan if tile is None else replace(plan, bgmv_expand_tile=tile)
    gen = torch.Generator().manual_seed(seed_of("norm-lora", backend, dtype, pattern, num_tokens))
    case = make_case(dtype, num_tokens, "single", pattern, gen)
    case.y = torch.nan_to_num(case.y, nan=0.5)  # the norm reads every row: no NaN poison here
    shrunk = gathered_shrink(case, gen)
    hidden = case.offsets[-1]
    x = torch.empty(num_tokens, hidden + 8, dtype=dtype, device=DEVICE)[:, :-8]  # strided rows
    x.copy_(case.y)
    weight = (1 + torch.randn(hidden, generator=gen) / 4).to(dtype).to(DEVICE)
    residual = torch.randn(num_tokens, hidden, generator=gen).to(dtype).to(DEVICE)
    counters = torch.zeros(64, dtype=torch.int32, device=DEVICE)
    res_fused, res_unfused = residual.clone(), residual.clone()
    for _ in range(2):  # a second launch on the same counters: they are left zero
        out = add_rms_norm_lora(
            x.clone(), res_fused, weight, 1e-5, shrunk, case.lora_b, case.batch, counters, fused_plan
        )
        assert torch.count_nonzero(counters) == 0
        unfused = x.clone()
        lora_expand_shrunk_in_gemm(unfused, shrunk, case.lora_b, case.batch, case.offsets, plan=plan)
        expected = add_rms_norm(
            unfused, res_unfused, weight, 1e-5, backend="triton" if backend == "triton" else "torch"
        )
        assert torch.equal(res_fused.view(torch.int8), res_unfused.view(torch.int8))
        if DEVICE == "cpu":
            assert torch.equal(out.view(torch.int8), expected.view(torch.int8))
        else:  # on a GPU the norm's sum runs over another warp count: the last bit may differ
            torch.testing.assert_close(
                out, expected, rtol=NORM_RTOL[dtype], atol=NORM_RTOL[dtype], equal_nan=True
            )
    # against float64 on the rows with an adapter: the residual gained y + LoRA twice
    written = case.slot_ids >= 0
    if written.any():
        ref = reference_lora(case.y, case.x, case.lora_a, case.lora_b, case.slot_ids, case.offsets)
        ref_res = residual.double() + 2 * ref
        err = rel_err(res_fused[written], ref_res[written])
        assert err < 4 * TOL[dtype], f"relative error {err:.3e}"


def test_add_rms_norm_lora_rejects_bad_input():
    from multilora_studio.kernels.lora import add_rms_norm_lora

    gen = torch.Generator().manual_seed(seed_of("norm-errors"))
    case = make_case(torch.float32, 5, "single", "uniform", gen)
    shrunk = gathered_shrink(case, gen)
    hidden = case.offsets[-1]
    weight = torch.ones(hidden, device=DEVICE)
    residual = torch.zeros(5, hidden, device=DEVICE)
    counters = torch.zeros(8, dtype=torch.int32, device=DEVICE)

    def call(**changes):
        args = dict(
            x=case.y,
            residual=residual,
            weight=weight,
            eps=1e-5,
            shrunk=shrunk,
            lora_b=case.lora_b,
            batch=case.batch,
            counters=counters,
            plan=plan_for("triton"),
        )
        args.update(changes)
        return add_rms_norm_lora(**args)

    with pytest.raises(ValueError, match="x and residual"):
        call(residual=residual[:, :-1])
    with pytest.raises(ValueError, match="weight must be"):
        call(weight=weight[:-1])
    with pytest.raises(ValueError, match="shrunk must be"):
        call(shrunk=shrunk[:-1])
    with pytest.raises(ValueError, match="lora_b must be"):
        call(lora_b=case.lora_b.half())
    with pytest.raises(ValueError, match="counters must be"):
        call(counters=counters[:2])


# ------------------------------------------------------------ per-token adapter strength

# Strengths mixed token by token in one batch (the same adapter at several of them included).
STRENGTHS = torch.tensor([0.0, 0.5, 1.0, 2.0, 1.0, 0.25])
# Every path that adds a LoRA term: (path, backend, fused tile)
# Every path that adds a LoRA term: (path, backend, fused tile); "triton-grouped" forces the
# slot-grouped kernels at every token count.
LINEAR_BACKENDS = [
    ("triton", NEEDS_TRITON),
    ("triton-grouped", NEEDS_TRITON),
    ("torch", ()),
    ("numba", NEEDS_NUMBA),
]
SCALED_PATHS = [
    *(pytest.param("add_lora", b, None, marks=m, id=f"add_lora-{b}") for b, m in LINEAR_BACKENDS),
    *(
        pytest.param("shrink_expand", b, None, marks=m, id=f"shrink_expand-{b}")
        for b, m in LINEAR_BACKENDS[:3]
    ),
    pytest.param("shrunk_in_gemm", "triton", None, marks=NEEDS_TRITON, id="shrunk_in_gemm-triton"),
    pytest.param("shrunk_in_gemm", "torch", None, id="shrunk_in_gemm-torch"),
    pytest.param("silu", "triton", None, marks=NEEDS_TRITON, id="silu-triton"),
    pytest.param("silu", "triton", 1024, marks=NEEDS_TRITON, id="silu-triton-small-tiles"),
    pytest.param("silu", "torch", None, id="silu-torch"),
    pytest.param("norm", "triton", None, marks=NEEDS_TRITON, id="norm-triton"),
    pytest.param("norm", "triton", 1024, marks=NEEDS_TRITON, id="norm-triton-small-tiles"),
    pytest.param("norm", "torch", None, id="norm-torch"),
]
PATH_SHAPE = {
    "add_lora": "qkv",
    "shrink_expand": "gate_up",
    "shrunk_in_gemm": "qkv",
    "silu": "gate_up",
    "norm": "single",
}


def strengths_for(num_tokens: int) -> torch.Tensor:
    return STRENGTHS[torch.arange(num_tokens) % len(STRENGTHS)].to(DEVICE)  # [T] float32


def run_path(path: str, backend: str, tile: int | None, case: Case, batch: LoRABatch, gen_seed: int):
    """The path's output: y (LoRA added) for the linear paths, (act, residual) for the fused ones."""
    grouped = backend == "triton-grouped"
    plan = plan_for("triton" if grouped else backend, grouped=grouped)
    if grouped:
        assert plan is not None and not plan.uses_bgmv(case.x.shape[0])
    gen = torch.Generator().manual_seed(gen_seed)
    if path == "add_lora":
        return add_lora(case.y.clone(), case.x, case.lora_a, case.lora_b, batch, case.offsets, plan=plan)
    if path == "shrink_expand":
        buf = lora_shrink(case.x, case.lora_a, batch, plan=plan)
        return lora_expand(case.y.clone(), buf, case.lora_b, batch, case.offsets, plan=plan)
    shrunk = gathered_shrink(case, gen)
    if path == "shrunk_in_gemm":
        return lora_expand_shrunk_in_gemm(case.y.clone(), shrunk, case.lora_b, batch, case.offsets, plan=plan)
    fused_plan = plan if tile is None else replace(plan, bgmv_expand_tile=tile)
    if path == "silu":
        from multilora_studio.kernels.lora import silu_and_mul_lora

        return silu_and_mul_lora(case.y.clone(), shrunk, case.lora_b, batch, fused_plan)
    from multilora_studio.kernels.lora import add_rms_norm_lora

    residual = torch.randn(case.y.shape, generator=gen).to(case.y.dtype).to(DEVICE)
    weight = torch.ones(case.offsets[-1], dtype=case.y.dtype, device=DEVICE)
    counters = torch.zeros(64, dtype=torch.int32, device=DEVICE)
    add_rms_norm_lora(
        case.y.clone(), residual, weight, 1e-5, shrunk, case.lora_b, batch, counters, fused_plan
    )
    return residual


def scaled_case(path: str, backend: str, dtype: torch.dtype, num_tokens: int) -> tuple[Case, int]:
    seed = seed_of("strength", path, backend, dtype, num_tokens)
    case = make_case(dtype, num_tokens, PATH_SHAPE[path], "base_mixed", torch.Generator().manual_seed(seed))
    if path == "norm":
        case.y = torch.nan_to_num(case.y, nan=0.5)  # the norm reads every row: no NaN poison
    return case, seed


def on_triton_path(path: str, backend: str, tile: int | None) -> bool:
    return backend.startswith("triton")


# Under the interpreter each Triton path runs once, token count and dtype turning by path; the
# next test takes the other turn, so each path meets both token counts.
@pytest.mark.parametrize(
    ("path", "backend", "tile", "num_tokens", "dtype"),
    grid(SCALED_PATHS, [6, 33], DTYPES, interpreted=on_triton_path, full=0),
)
def test_strengths_per_token_match_reference(path, backend, tile, dtype, num_tokens):
    """Strengths 0 / 0.25 / 0.5 / 1 / 2 mixed token by token: each row gets its own strength
    times its adapter's term (float64 reference); rows at 0 and rows without an adapter keep y."""
    if backend == "numba" and dtype != torch.float32:
        pytest.skip("the numba backend computes float32 only")
    case, seed = scaled_case(path, backend, dtype, num_tokens)
    scales = strengths_for(num_tokens)
    batch = build_lora_batch(case.slot_ids, case.slot_ranks, NUM_SLOTS, scales)
    out = run_path(path, backend, tile, case, batch, seed)
    ref = reference_lora(case.y, case.x, case.lora_a, case.lora_b, case.slot_ids, case.offsets, scales)
    written = (case.slot_ids >= 0) & (scales != 0)
    if path == "silu":
        half = case.offsets[1]
        ref = torch.nn.functional.silu(ref[:, :half]) * ref[:, half:]
        assert rel_err(out[written], ref[written]) < 2 * TOL[dtype]
        return
    if path == "norm":
        gen = torch.Generator().manual_seed(seed)
        gathered_shrink(case, gen)  # the same draws as run_path before the residual
        residual = torch.randn(case.y.shape, generator=gen).to(dtype).to(DEVICE)
        assert rel_err(out[written], (residual.double() + ref)[written]) < 4 * TOL[dtype]
        return
    keep = ~written  # no adapter, or strength 0: y bit for bit
    assert torch.equal(out[keep].view(torch.int8), case.y[keep].view(torch.int8))
    err = rel_err(out[written], ref[written])
    assert err < TOL[dtype], f"relative error {err:.3e} over {TOL[dtype]:.1e}"


@pytest.mark.parametrize(
    ("path", "backend", "tile", "num_tokens", "dtype"),
    grid(SCALED_PATHS, [6, 33], [torch.float32, torch.bfloat16], interpreted=on_triton_path, full=0, turn=1),
)
def test_strength_one_rows_are_bit_for_bit_unchanged(path, backend, tile, dtype, num_tokens):
    """Rows at strength 1.0 in a batch that mixes strengths give exactly what the batch without
    strengths gives; rows at 0 give exactly what a batch without their adapter gives."""
    if backend == "numba" and dtype != torch.float32:
        pytest.skip("the numba backend computes float32 only")
    case, seed = scaled_case(path, backend, dtype, num_tokens)
    scales = strengths_for(num_tokens)
    plain = run_path(path, backend, tile, case, case.batch, seed)
    scaled = run_path(
        path, backend, tile, case, build_lora_batch(case.slot_ids, case.slot_ranks, NUM_SLOTS, scales), seed
    )
    no_adapter = case.slot_ids.masked_fill(scales == 0, -1)
    base = run_path(path, backend, tile, case, build_lora_batch(no_adapter, case.slot_ranks, NUM_SLOTS), seed)
    at_one, at_zero = scales == 1.0, scales == 0.0
    assert torch.equal(scaled[at_one].view(torch.int8), plain[at_one].view(torch.int8))
    assert torch.equal(scaled[at_zero].view(torch.int8), base[at_zero].view(torch.int8))
    moved = ~(at_one | at_zero) & (case.slot_ids >= 0)
    if moved.any():
        assert not torch.equal(scaled[moved], plain[moved])


@pytest.mark.parametrize("stacked_max", [0, 64])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_strengths_on_the_torch_stacked_and_grouped_paths(stacked_max, dtype):
    """The torch backend's stacked (decode) path and per-adapter path apply each token's strength;
    rows at 1.0 stay bit for bit what the batch without strengths gives."""
    plan = LoRAPlan(backend="torch", stacked_max_tokens=stacked_max)
    gen = torch.Generator().manual_seed(seed_of("stacked-strength", stacked_max, dtype))
    case = make_case(dtype, 12, "qkv", "distinct", gen)  # every active slot, consecutive
    scales = strengths_for(12)
    batch = build_lora_batch(case.slot_ids, case.slot_ranks, NUM_SLOTS, scales)
    out = add_lora(case.y.clone(), case.x, case.lora_a, case.lora_b, batch, case.offsets, plan)
    plain = add_lora(case.y.clone(), case.x, case.lora_a, case.lora_b, case.batch, case.offsets, plan)
    ref = reference_lora(case.y, case.x, case.lora_a, case.lora_b, case.slot_ids, case.offsets, scales)
    written = (case.slot_ids >= 0) & (scales != 0)
    assert rel_err(out[written], ref[written]) < TOL[dtype]
    assert torch.equal(out[scales == 0].view(torch.int8), case.y[scales == 0].view(torch.int8))
    assert torch.equal(out[scales == 1].view(torch.int8), plain[scales == 1].view(torch.int8))


# --------------------------------------------------------------------------- batch invariance

ROW_TILED = LoRAPlan(backend="torch", stacked_max_tokens=0, batch_invariant=True, gemm_row_tile=8)


@pytest.mark.skipif(DEVICE != "cpu", reason="the torch ops' row tiles are the CPU engine's")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("pattern", PATTERNS)
def test_row_tiled_torch_lora_matches_reference_and_keeps_each_rows_bits(dtype, pattern):
    """The torch ops in 8-row tiles: right, and token 0's row is the same bits whether it is
    alone or among 1..40 tokens (its adapter's group growing or not)."""
    gen = torch.Generator().manual_seed(seed_of("row-tiled", dtype, pattern))
    case = make_case(dtype, 41, "qkv", pattern, gen)
    case.slot_ids[0] = 1  # token 0 always has an adapter (rank 8), and an unpoisoned row
    case.y[0] = torch.randn(case.y.shape[1], generator=gen).to(dtype).to(DEVICE)
    y = case.y.clone()
    add_lora(y, case.x, case.lora_a, case.lora_b, case.batch, case.offsets, plan=ROW_TILED)
    untouched = case.slot_ids < 0
    assert torch.equal(y[untouched].view(torch.int8), case.y[untouched].view(torch.int8))
    ref = reference_lora(case.y, case.x, case.lora_a, case.lora_b, case.slot_ids, case.offsets)
    assert rel_err(y[~untouched], ref[~untouched]) < TOL[dtype]
    for tokens in (1, 2, 9, 17, 40):
        part = replace(case, x=case.x[:tokens], slot_ids=case.slot_ids[:tokens], y=case.y[:tokens])
        y_part = part.y.clone()
        add_lora(y_part, part.x, part.lora_a, part.lora_b, part.batch, part.offsets, plan=ROW_TILED)
        assert torch.equal(y_part[0], y[0]), tokens


@pytest.mark.skipif(DEVICE != "cpu", reason="the torch ops' row tiles are the CPU engine's")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_row_tiled_torch_lora_applies_per_token_strengths(dtype):
    gen = torch.Generator().manual_seed(seed_of("row-tiled-strengths", dtype))
    case = make_case(dtype, 41, "gate_up", "uniform", gen)
    scales = STRENGTHS[torch.arange(41) % len(STRENGTHS)].to(DEVICE)  # [T]
    batch = build_lora_batch(case.slot_ids, case.slot_ranks, NUM_SLOTS, scales)
    out = add_lora(case.y.clone(), case.x, case.lora_a, case.lora_b, batch, case.offsets, plan=ROW_TILED)
    plain = add_lora(
        case.y.clone(), case.x, case.lora_a, case.lora_b, case.batch, case.offsets, plan=ROW_TILED
    )
    ref = reference_lora(case.y, case.x, case.lora_a, case.lora_b, case.slot_ids, case.offsets, scales)
    written = (case.slot_ids >= 0) & (scales != 0)
    assert rel_err(out[written], ref[written]) < TOL[dtype]
    assert torch.equal(out[scales == 0].view(torch.int8), case.y[scales == 0].view(torch.int8))
    assert torch.equal(out[scales == 1].view(torch.int8), plain[scales == 1].view(torch.int8))


# ------------------------------------------- DoRA / lora_bias row terms in the folding kernels


def make_rows(width: int, dtype: torch.dtype, gen: torch.Generator, kinds: str) -> RowTerms:
    """Random per-slot row terms [slots + 1, width]: ``kinds`` "scale", "bias" or "both"; the
    last row (tokens without an adapter) 1 and 0."""
    scale = (1 + torch.randn(NUM_SLOTS + 1, width, generator=gen) / 4).to(dtype)
    bias = (torch.randn(NUM_SLOTS + 1, width, generator=gen) / 4).to(dtype)
    scale[-1], bias[-1] = 1, 0
    return RowTerms(
        scale.to(DEVICE) if kinds != "bias" else None, bias.to(DEVICE) if kinds != "scale" else None
    )


def rows_reference(y: torch.Tensor, rows: RowTerms, slot_ids: torch.Tensor, strengths: torch.Tensor):
    """float64 ``y * scale[slot] + strength * bias[slot]`` on the rows with an adapter, y elsewhere."""
    out = y.double().clone()
    for t, slot in enumerate(slot_ids.tolist()):
        if slot < 0 or RANKS[slot] == 0:
            continue
        if rows.scale is not None:
            out[t] *= rows.scale[slot].double()
        if rows.bias is not None:
            out[t] += strengths[t].double() * rows.bias[slot].double()
    return out


@pytest.mark.parametrize("kinds", ["scale", "bias", "both"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_apply_row_terms_scales_and_shifts_only_adapted_rows(kinds, dtype):
    gen = torch.Generator().manual_seed(seed_of("rows", kinds, dtype))
    case = make_case(dtype, 11, "qkv", "base_mixed", gen)
    rows = make_rows(case.offsets[-1], dtype, gen, kinds)
    scales = strengths_for(11)
    batch = build_lora_batch(case.slot_ids, case.slot_ranks, NUM_SLOTS, scales)
    out = apply_row_terms(case.y, rows, batch)
    untouched = case.slot_ids < 0
    assert torch.equal(out[untouched].view(torch.int8), case.y[untouched].view(torch.int8))
    ref = rows_reference(case.y, rows, case.slot_ids, scales)
    assert rel_err(out[~untouched], ref[~untouched]) < 2 * TOL[dtype]


def assert_same_bits(actual: torch.Tensor, expected: torch.Tensor, backend: str, kinds: str) -> None:
    """Bit for bit, except (a) bf16 from Triton's interpreter, which rounds float32 to bf16 toward
    zero where torch (and Triton on a GPU) round to nearest, so a torch op beside it may differ by
    one unit in the last place, a few after SiLU-and-mul's roundings; (b) a slot with both a scale
    and a bias compiled for a GPU, where the kernel's scale and bias may become one multiply-add
    (PEFT never gives one adapter both; with one of them the other is 1 or 0 and the bits agree)."""
    if backend == "triton" and INTERPRETED and actual.dtype == torch.bfloat16:
        torch.testing.assert_close(actual, expected, rtol=2**-5, atol=2**-6, equal_nan=True)
        return
    if backend == "triton" and not INTERPRETED and kinds == "both":
        ulps = 4 * torch.finfo(actual.dtype).eps
        torch.testing.assert_close(actual, expected, rtol=ulps, atol=ulps, equal_nan=True)
        return
    assert torch.equal(actual.view(torch.int8), expected.view(torch.int8))


ROW_PATHS = [
    pytest.param("silu", "triton", None, marks=NEEDS_TRITON, id="silu-triton"),
    pytest.param("silu", "triton", 1024, marks=NEEDS_TRITON, id="silu-triton-small-tiles"),
    pytest.param("norm", "triton", None, marks=NEEDS_TRITON, id="norm-triton"),
    pytest.param("norm", "triton", 1024, marks=NEEDS_TRITON, id="norm-triton-small-tiles"),
    pytest.param("silu", "torch", None, id="silu-torch"),
    pytest.param("norm", "torch", None, id="norm-torch"),
]


@pytest.mark.parametrize(
    ("path", "backend", "tile", "kinds", "dtype", "num_tokens"),
    grid(ROW_PATHS, ["scale", "bias", "both"], DTYPES, [1, 13], interpreted=on_triton_path, full=1),
)
def test_row_terms_fold_equals_expand_rows_then_op(path, backend, tile, kinds, dtype, num_tokens):
    """SiLU-and-mul and residual-add + RMSNorm with the expand and the slots' row terms folded in
    equal the expand, ``apply_row_terms`` and the op one after the other, bit for bit (per-token
    strengths mixed in), and the float64 reference of y + LoRA scaled and shifted per slot."""
    from multilora_studio.kernels.fused_ops import add_rms_norm, silu_and_mul
    from multilora_studio.kernels.lora import add_rms_norm_lora, silu_and_mul_lora

    plan = plan_for(backend)
    fused_plan = plan if tile is None else replace(plan, bgmv_expand_tile=tile)
    gen = torch.Generator().manual_seed(seed_of("rows-fold", path, backend, tile, kinds, dtype, num_tokens))
    case = make_case(dtype, num_tokens, PATH_SHAPE[path], "base_mixed", gen)
    case.y = torch.nan_to_num(case.y, nan=0.5)  # the norm reads every row: no NaN poison
    shrunk = gathered_shrink(case, gen)
    rows = make_rows(case.offsets[-1], dtype, gen, kinds)
    scales = strengths_for(num_tokens)
    batch = build_lora_batch(case.slot_ids, case.slot_ranks, NUM_SLOTS, scales)
    unfused = case.y.clone()
    lora_expand_shrunk_in_gemm(unfused, shrunk, case.lora_b, batch, case.offsets, plan=plan)
    unfused = apply_row_terms(unfused, rows, batch)
    op_backend = "triton" if backend == "triton" else "torch"
    ref = rows_reference(
        reference_lora(case.y, case.x, case.lora_a, case.lora_b, case.slot_ids, case.offsets, scales),
        rows,
        case.slot_ids,
        scales,
    )
    written = case.slot_ids >= 0
    if path == "silu":
        out = silu_and_mul_lora(case.y.clone(), shrunk, case.lora_b, batch, fused_plan, rows)
        assert_same_bits(out, silu_and_mul(unfused, backend=op_backend), backend, kinds)
        half = case.offsets[1]
        ref_act = torch.nn.functional.silu(ref[:, :half]) * ref[:, half:]
        if written.any():
            assert rel_err(out[written], ref_act[written]) < 3 * TOL[dtype]
        return
    residual = torch.randn(case.y.shape, generator=gen).to(dtype).to(DEVICE)
    weight = torch.ones(case.offsets[-1], dtype=dtype, device=DEVICE)
    counters = torch.zeros(64, dtype=torch.int32, device=DEVICE)
    res_fused, res_unfused = residual.clone(), residual.clone()
    add_rms_norm_lora(
        case.y.clone(), res_fused, weight, 1e-5, shrunk, case.lora_b, batch, counters, fused_plan, rows
    )
    add_rms_norm(unfused, res_unfused, weight, 1e-5, backend=op_backend)
    assert_same_bits(res_fused, res_unfused, backend, kinds)
    if written.any():
        assert rel_err(res_fused[written], (residual.double() + ref)[written]) < 4 * TOL[dtype]


@NEEDS_TRITON
def test_row_terms_of_the_wrong_shape_are_refused():
    from multilora_studio.kernels.lora import silu_and_mul_lora

    gen = torch.Generator().manual_seed(seed_of("rows-errors"))
    case = make_case(torch.float32, 3, "gate_up", "uniform", gen)
    shrunk = gathered_shrink(case, gen)
    rows = make_rows(case.offsets[-1], torch.float32, gen, "both")
    with pytest.raises(ValueError, match="row scale must be"):
        silu_and_mul_lora(
            case.y, shrunk, case.lora_b, case.batch, plan_for("triton"), RowTerms(rows.scale[:-1], None)
        )
    with pytest.raises(ValueError, match="row bias must be"):
        silu_and_mul_lora(
            case.y, shrunk, case.lora_b, case.batch, plan_for("triton"), RowTerms(None, rows.bias.half())
        )
