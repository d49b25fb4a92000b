"""Row scores (chosen token's log-probability, rank, top-k): Triton and torch paths against float64."""

from __future__ import annotations

import pytest
import torch

from multilora_studio.kernels.row_scores import MAX_TOP_K, row_scores, top_k_torch
from tests.kernels.device import DEVICE

TOLERANCE = 2e-5  # float32 sums against float64
BACKENDS = ["torch", "triton"]
SHAPES = [
    (3, 128256, 5),
    (7, 49152, 1),
    (2, 101, 1),
    (5, 1000, 0),
    (4, 100, 20),
    (2, 4096 * 3 + 7, MAX_TOP_K),
]


def unpack(packed: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(chosen lp [R], rank [R], top ids [R, k], top lp [R, k]) of a packed [R, 2 + 2k] result."""
    packed = packed.cpu()
    return packed[:, 0], packed[:, 1], packed[:, 2 : 2 + k].long(), packed[:, 2 + k :]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("rows", "vocab", "k"), SHAPES)
def test_scores_equal_a_float64_log_softmax(backend, rows, vocab, k):
    generator = torch.Generator().manual_seed(rows * vocab + k)
    logits = torch.randn(rows, vocab, generator=generator) * 4
    chosen = torch.randint(0, vocab, (rows,), generator=generator)
    packed = row_scores(logits.to(DEVICE), chosen.to(DEVICE), k, backend=backend)
    assert packed.shape == (rows, 2 + 2 * k) and packed.dtype == torch.float32
    chosen_lp, rank, top_ids, top_lp = unpack(packed, k)
    exact = torch.log_softmax(logits.double(), dim=-1)  # [R, V]
    reference = torch.topk(logits, k, dim=-1)
    assert torch.allclose(chosen_lp.double(), exact.gather(1, chosen[:, None])[:, 0], atol=TOLERANCE, rtol=0)
    expected_rank = (logits > logits.gather(1, chosen[:, None])).sum(dim=1) + 1
    assert torch.equal(rank.long(), expected_rank)
    assert torch.equal(top_ids, reference.indices)
    assert torch.allclose(top_lp.double(), exact.gather(1, reference.indices), atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_half_precision_logits_score_as_their_float32_values(backend):
    generator = torch.Generator().manual_seed(3)
    logits = (torch.randn(4, 5000, generator=generator) * 3).to(torch.bfloat16)
    chosen = torch.randint(0, 5000, (4,), generator=generator)
    packed = row_scores(logits.to(DEVICE), chosen.to(DEVICE), 4, backend=backend).cpu()
    widened = row_scores(logits.float(), chosen, 4, backend="torch")
    assert torch.allclose(packed[:, :2], widened[:, :2], atol=TOLERANCE, rtol=0)
    assert torch.allclose(packed[:, 6:], widened[:, 6:], atol=TOLERANCE, rtol=0)
    # bf16 logits tie often: the top ids may differ in order only among equal values
    ids = packed[:, 2:6].long()
    assert torch.equal(logits.float().gather(1, ids), torch.topk(logits.float(), 4, dim=-1).values)


def test_triton_breaks_ties_by_the_smaller_token_id():
    logits = torch.zeros(2, 3000)
    logits[0, [2999, 5, 1500, 700]] = 2.0  # four equal maxima across blocks
    logits[1, [10, 11]] = 1.0
    chosen = torch.tensor([1500, 11])
    chosen_lp, rank, top_ids, _ = unpack(
        row_scores(logits.to(DEVICE), chosen.to(DEVICE), 5, backend="triton"), 5
    )
    assert top_ids[0].tolist() == [5, 700, 1500, 2999, 0]
    assert top_ids[1].tolist() == [10, 11, 0, 1, 2]
    assert rank.tolist() == [1.0, 1.0]  # equal logits are not larger
    assert chosen_lp[0] == pytest.approx(float(torch.log_softmax(logits[0].double(), 0)[1500]), abs=TOLERANCE)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_of_a_wider_tensor_are_scored_in_place(backend):
    generator = torch.Generator().manual_seed(5)
    wide = torch.randn(3, 1200, generator=generator)
    logits = wide[:, :1000]  # row stride 1200
    chosen = torch.tensor([0, 999, 500])
    packed = row_scores(logits.to(DEVICE), chosen.to(DEVICE), 3, backend=backend).cpu()
    expected = row_scores(logits.contiguous(), chosen, 3, backend="torch")
    assert torch.allclose(packed, expected, atol=TOLERANCE, rtol=0)


def test_no_rows_give_an_empty_result():
    packed = row_scores(
        torch.zeros(0, 50, device=DEVICE), torch.zeros(0, dtype=torch.long, device=DEVICE), 2, "triton"
    )
    assert packed.shape == (0, 6)


def test_blocked_top_k_equals_torch_topk():
    logits = torch.randn(6, 128256)
    for k in (1, 3):
        values, ids = top_k_torch(logits, k)
        reference = torch.topk(logits, k, dim=-1)
        assert torch.equal(values, reference.values) and torch.equal(ids, reference.indices)


@pytest.mark.parametrize(
    ("logits", "chosen", "k", "backend", "message"),
    [
        (torch.zeros(10), torch.zeros(1, dtype=torch.long), 1, "torch", "2-D"),
        (torch.zeros(2, 10), torch.zeros(3, dtype=torch.long), 1, "torch", "chosen"),
        (torch.zeros(2, 10), torch.zeros(2, dtype=torch.long), MAX_TOP_K + 1, "torch", "k must be"),
        (torch.zeros(2, 10), torch.zeros(2, dtype=torch.long), 11, "torch", "k must be"),
        (torch.zeros(2, 10), torch.zeros(2, dtype=torch.long), 1, "cuda", "backend"),
    ],
)
def test_bad_input_is_refused(logits, chosen, k, backend, message):
    with pytest.raises(ValueError, match=message):
        row_scores(logits, chosen, k, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_columns_past_a_rows_vocabulary_score_as_absent(backend):
    """Rows padded with -inf to a wider vocabulary (an adapter's added tokens in the batch): whole
    blocks of -inf add nothing, and the scores equal those of the row's own columns."""
    generator = torch.Generator().manual_seed(11)
    vocab, width = 5000, 5000 + 4096 * 2
    logits = torch.full((3, width), float("-inf"))
    logits[:, :vocab] = torch.randn(3, vocab, generator=generator) * 4
    chosen = torch.randint(0, vocab, (3,), generator=generator)
    wide = unpack(row_scores(logits.to(DEVICE), chosen.to(DEVICE), 4, backend=backend), 4)
    own = unpack(
        row_scores(logits[:, :vocab].contiguous().to(DEVICE), chosen.to(DEVICE), 4, backend=backend), 4
    )
    for got, expected in zip(wide, own, strict=True):
        assert torch.isfinite(got.float()).all()
        torch.testing.assert_close(got, expected, rtol=0, atol=TOLERANCE)
