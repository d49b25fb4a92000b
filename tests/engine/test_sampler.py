"""The sampler draws from what transformers' own warpers leave, with their probabilities.

The reference is transformers' ``TemperatureLogitsWarper``, ``TopKLogitsWarper``,
``TopPLogitsWarper`` and ``MinPLogitsWarper``, applied in the order ``generate()`` applies them
(temperature, top-k, top-p, min-p; ``GenerationMixin._get_logits_processor``), then a softmax.
The engine applies min-p before top-k and top-p (vLLM's order). Min-p keeps a token by its
ratio to the most likely one, which top-k does not change, so the two orders agree for min-p
with temperature and top-k (the cases here); with top-p they can differ, and the engine follows
vLLM. The penalties, biases and bans are checked against transformers' processors in
``test_processors_vs_transformers.py``.

The sampler does not expose its probabilities, so it is checked by what it draws: ``N``
seeded draws of hand-made logits must (1) contain every token the reference keeps and none
it removes, and (2) pass a chi-square goodness-of-fit test against the reference's
probabilities at ``ALPHA``.

False failures: every kept token has a reference probability of at least ``MIN_KEPT``, so a
correct sampler misses one in ``N`` draws with probability below ``8 * (1 - MIN_KEPT) ** N``
(< 1e-16) per case; each chi-square test rejects a correct sampler with probability
``ALPHA`` = 1e-6 over the choice of seed (in the chi-square approximation, which every
case's expected counts of at least 5 justify), so at most ``len(CASES) * 1e-6`` for the whole file
(union bound). The seed is fixed, so the outcome is deterministic: it can change only when
torch's random streams change.
"""

from __future__ import annotations

from functools import cache

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from multilora_studio.engine.sampling.sampler import make_generator, sample
from multilora_studio.engine.sampling_params import SamplingParams
from tests.engine.sampling_rows import batch_of

N = 4000  # draws per case
ALPHA = 1e-6  # chi-square significance: the false-failure rate of each frequency test
MIN_KEPT = 0.01  # every case's smallest kept probability is above this (asserted below)
SEED = 20240607

# Probabilities 0.30 ... 0.02 in shuffled token order, as float32 logits [8].
PROBS = torch.tensor([0.22, 0.12, 0.06, 0.30, 0.02, 0.03, 0.16, 0.09])
LOGITS = PROBS.log()
TIED = torch.tensor([2.0, 1.0, 1.0, 0.0, -0.5, -1.0])  # tokens 1 and 2 tie for second place
MASKED = torch.tensor([0.5, float("-inf"), 1.5, 0.0, float("-inf"), 1.0])  # two tokens already removed

CASES = {
    # name: (logits, sampling parameters, the reference's kept tokens, worked out by hand)
    "plain": (LOGITS, dict(), [0, 1, 2, 3, 4, 5, 6, 7]),
    "sharper": (LOGITS, dict(temperature=0.8), [0, 1, 2, 3, 4, 5, 6, 7]),
    "flatter": (LOGITS, dict(temperature=1.6), [0, 1, 2, 3, 4, 5, 6, 7]),
    "top_k=3": (LOGITS, dict(top_k=3), [3, 0, 6]),
    "top_k=5 at temperature 0.8": (LOGITS, dict(temperature=0.8, top_k=5), [3, 0, 6, 1, 7]),
    "top_k=1": (LOGITS, dict(top_k=1, temperature=1.5), [3]),
    "top_k larger than the vocabulary": (LOGITS, dict(top_k=50), [0, 1, 2, 3, 4, 5, 6, 7]),
    # 0.30 + 0.22 = 0.52 < 0.6: the 0.16 token crosses top_p and stays
    "top_p=0.6": (LOGITS, dict(top_p=0.6), [3, 0, 6]),
    # 0.68 < 0.75: the 0.12 token crosses top_p and stays
    "top_p=0.75": (LOGITS, dict(top_p=0.75), [3, 0, 6, 1]),
    "top_p after temperature 0.5": (LOGITS, dict(temperature=0.5, top_p=0.8), [3, 0, 6]),
    "temperature, top_k and top_p": (LOGITS, dict(temperature=1.3, top_k=6, top_p=0.9), [3, 0, 6, 1, 7]),
    "top_p below the largest probability": (LOGITS, dict(top_p=1e-3), [3]),
    "ties at the k-th logit are kept": (TIED, dict(top_k=2), [0, 1, 2]),
    # min-p keeps p >= min_p * p_max: 0.35 * 0.30 = 0.105
    "min_p=0.35": (LOGITS, dict(min_p=0.35), [3, 0, 6, 1]),
    # at temperature 0.8, (p / 0.30) ** 1.25 >= 0.5 means p >= 0.172: the 0.16 token goes
    "min_p=0.5 at temperature 0.8": (LOGITS, dict(min_p=0.5, temperature=0.8), [3, 0]),
    # top_k keeps 0.30, 0.22, 0.16; min-p at 0.6 * 0.30 = 0.18 keeps the first two
    "min_p=0.6 with top_k=3": (LOGITS, dict(min_p=0.6, top_k=3), [3, 0]),
    "tokens already at -inf": (MASKED, dict(top_p=0.95), [0, 2, 3, 5]),
}


def reference_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[V] probabilities ``generate(do_sample=True)`` samples from for one row [V] of logits."""
    warpers = LogitsProcessorList()
    if params.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(params.temperature))
    if params.top_k != 0:
        warpers.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1.0:
        warpers.append(TopPLogitsWarper(params.top_p))
    if params.min_p > 0.0:
        warpers.append(MinPLogitsWarper(params.min_p))
    no_input_ids = torch.zeros(1, 0, dtype=torch.long)
    return warpers(no_input_ids, logits[None].clone())[0].double().softmax(-1)


def draw(logits: torch.Tensor, params: SamplingParams, n: int = N) -> torch.Tensor:
    """[V] counts of ``n`` tokens the engine samples from ``logits`` [V], one seeded stream."""
    generator = make_generator(params, logits.device, 0)
    batch = batch_of([params] * n, generators=[generator] * n)
    tokens = sample(logits.expand(n, -1).contiguous(), batch).tolist()
    return torch.bincount(torch.tensor(tokens), minlength=logits.shape[-1])


@cache
def draws_of(case: str) -> torch.Tensor:
    """[V] counts of the case's ``N`` seeded draws (shared by the tests of one case)."""
    logits, options, _ = CASES[case]
    return draw(logits, SamplingParams(seed=SEED, **options))


def chi_square_p_value(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson's goodness-of-fit p-value over the cells with a positive expectation."""
    statistic = ((observed - expected) ** 2 / expected).sum()
    dof = torch.tensor(len(expected) - 1, dtype=torch.float64)
    return torch.special.gammaincc(dof / 2, statistic / 2).item()  # the chi-square survival function


@pytest.mark.parametrize("case", list(CASES))
def test_the_sampler_keeps_what_transformers_keeps(case):
    logits, options, kept_by_hand = CASES[case]
    params = SamplingParams(seed=SEED, **options)
    reference = reference_probs(logits, params)
    kept = sorted(torch.nonzero(reference).flatten().tolist())
    assert kept == sorted(kept_by_hand), "the reference itself disagrees with the hand-worked case"
    assert reference[kept].min() > MIN_KEPT
    counts = draws_of(case)
    drawn = sorted(torch.nonzero(counts).flatten().tolist())
    assert drawn == kept, f"drew {drawn}, transformers keeps {kept}"


@pytest.mark.parametrize("case", list(CASES))
def test_seeded_frequencies_follow_the_reference_probabilities(case):
    logits, options, _ = CASES[case]
    params = SamplingParams(seed=SEED, **options)
    reference = reference_probs(logits, params)
    kept = torch.nonzero(reference).flatten()
    counts = draws_of(case)
    assert counts.sum() == counts[kept].sum(), "a token outside the reference's set was drawn"
    if len(kept) == 1:
        return  # one token: nothing to fit
    expected = N * reference[kept]
    assert expected.min() >= 5, "too few draws for the chi-square approximation"
    p_value = chi_square_p_value(counts[kept].double(), expected)
    frequencies = {int(t): round(int(c) / N, 4) for t, c in zip(kept, counts[kept], strict=True)}
    want = {int(t): round(float(p), 4) for t, p in zip(kept, reference[kept], strict=True)}
    assert p_value > ALPHA, f"p = {p_value:.2e}: drew {frequencies}, reference {want}"


def test_top_p_exactly_reached_drops_the_tokens_after_it():
    """Four tokens of 0.25 each (exact in float32) and top_p=0.5: the mass before the third is
    exactly 0.5, so it goes, as in transformers (which token of a tie stays is not fixed)."""
    params = SamplingParams(top_p=0.5, seed=SEED)
    uniform = torch.zeros(4)
    assert int(torch.count_nonzero(reference_probs(uniform, params))) == 2
    assert int(torch.count_nonzero(draw(uniform, params, 400))) == 2


def test_a_request_without_a_seed_draws_from_the_fallback_seed():
    unseeded = SamplingParams(temperature=1.3)
    first = make_generator(unseeded, torch.device("cpu"), fallback_seed=11)
    again = make_generator(unseeded, torch.device("cpu"), fallback_seed=11)
    seeded = make_generator(SamplingParams(temperature=1.3, seed=11), torch.device("cpu"), fallback_seed=99)
    draws = [torch.rand(8, generator=g) for g in (first, again, seeded)]
    assert torch.equal(draws[0], draws[1]) and torch.equal(draws[0], draws[2])
    assert make_generator(SamplingParams(temperature=0.0), torch.device("cpu"), 11) is None  # greedy


def test_same_seed_same_draws_and_another_seed_other_draws():
    params = SamplingParams(temperature=1.3, top_k=6, top_p=0.9, seed=SEED)
    first, again = draw(LOGITS, params, 500), draw(LOGITS, params, 500)
    assert torch.equal(first, again)
    other = draw(LOGITS, SamplingParams(temperature=1.3, top_k=6, top_p=0.9, seed=SEED + 1), 500)
    assert not torch.equal(first, other)


def test_each_row_of_a_batch_samples_with_its_own_parameters():
    """Rows with other parameters (and greedy rows) in one call each keep their own token set."""
    # every kept token of these has a probability above 0.15: each shows up in 160 draws
    cases = ["top_k=3", "top_p after temperature 0.5", "top_p=0.75", "ties at the k-th logit are kept"]
    width = max(CASES[c][0].shape[0] for c in cases)
    rows, params, generators, kept = [], [], [], []
    for index, case in enumerate(cases * 200):
        logits, options, case_kept = CASES[case]
        padded = torch.full((width,), float("-inf"))
        padded[: logits.shape[0]] = logits
        greedy = index % 5 == 4
        row_params = SamplingParams(**({"temperature": 0.0} if greedy else options), seed=index)
        rows.append(padded)
        params.append(row_params)
        generators.append(make_generator(row_params, padded.device, 0))
        kept.append({int(torch.argmax(padded))} if greedy else set(case_kept))
    tokens = sample(torch.stack(rows), batch_of(params, generators=generators)).tolist()
    assert all(token in row_kept for token, row_kept in zip(tokens, kept, strict=True))
    for case in cases:
        seen = {t for t, c, g in zip(tokens, cases * 200, params, strict=True) if c == case and not g.greedy}
        assert seen == set(CASES[case][2]), case
