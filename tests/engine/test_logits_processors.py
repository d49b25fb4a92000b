"""The logits processors against per-row loops written here from the formulas (OpenAI, HF/vLLM)."""

from __future__ import annotations

import pytest
import torch

from multilora_studio.engine.sampling.logits_processors import apply_processors
from multilora_studio.engine.sampling.sampler import sample
from multilora_studio.engine.sampling_params import SamplingParams
from tests.engine.processor_reference import reference_row
from tests.engine.sampling_rows import batch_of

V = 50
EOS = (2,)


def random_case(rows: int, seed: int) -> tuple[torch.Tensor, list[tuple[list[int], list[int]]]]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, V, generator=g) * 3
    histories = []
    for _ in range(rows):
        prompt = torch.randint(0, V, (int(torch.randint(1, 12, (1,), generator=g)),), generator=g).tolist()
        output = torch.randint(0, V, (int(torch.randint(0, 15, (1,), generator=g)),), generator=g).tolist()
        histories.append((prompt, output))
    return logits, histories


ROW_PARAMS = [
    SamplingParams(),
    SamplingParams(presence_penalty=1.5),
    SamplingParams(frequency_penalty=0.7, presence_penalty=-0.4),
    SamplingParams(repetition_penalty=1.8),
    SamplingParams(repetition_penalty=0.6, frequency_penalty=-1.1),
    SamplingParams(logit_bias={3: 100.0, 7: -42.5, 0: 0.25}),
    SamplingParams(min_tokens=200, stop_token_ids=(5, 9), max_tokens=300),
    SamplingParams(min_tokens=200, ignore_eos=True, max_tokens=300),
    SamplingParams(bad_words_token_ids=[[4], [1, 2, 6], [11, 12]]),
    SamplingParams(
        presence_penalty=0.3, frequency_penalty=0.2, repetition_penalty=1.3, logit_bias={1: 5.0}, min_tokens=3
    ),
]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_processor_equals_the_reference_formula(seed):
    logits, histories = random_case(len(ROW_PARAMS), seed)
    # a history that ends with a bad word's prefix, so the sequence's last token must be banned
    histories[8] = (histories[8][0], [*histories[8][1], 1, 2])
    before = logits.clone()
    got = apply_processors(logits, batch_of(ROW_PARAMS, histories, eos=EOS))
    assert torch.equal(logits, before)  # the raw logits (for log-probabilities) stay as they were
    for row, p in enumerate(ROW_PARAMS):
        want = reference_row(logits[row], p, *histories[row], EOS)
        torch.testing.assert_close(got[row], want, rtol=1e-5, atol=1e-5, msg=f"row {row}: {p}")
    assert got[8, 6] == float("-inf") and got[8, 4] == float("-inf")


def test_no_processor_returns_the_same_tensor():
    logits, histories = random_case(4, 3)
    params = [SamplingParams(), SamplingParams(temperature=0), SamplingParams(min_tokens=2), SamplingParams()]
    histories[2] = (histories[2][0], [1, 2, 3])  # min_tokens already reached: nothing to do
    assert apply_processors(logits, batch_of(params, histories, eos=EOS)) is logits


def test_min_p_keeps_tokens_above_min_p_times_the_top_probability():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -3.0]])
    temperature, min_p = 0.7, 0.2
    probs = (logits[0] / temperature).softmax(-1)
    kept = {i for i in range(5) if probs[i] >= min_p * probs.max()}
    assert 1 < len(kept) < 5
    drawn = set()
    for seed in range(300):
        p = SamplingParams(temperature=temperature, min_p=min_p, seed=seed)
        generator = torch.Generator().manual_seed(seed)
        drawn.add(int(sample(logits, batch_of([p], generators=[generator]))[0]))
    assert drawn == kept


def test_validation_names_the_field():
    for kwargs, name in [
        (dict(presence_penalty=2.5), "presence_penalty"),
        (dict(frequency_penalty=-3), "frequency_penalty"),
        (dict(repetition_penalty=0), "repetition_penalty"),
        (dict(min_p=1.5), "min_p"),
        (dict(logit_bias={1: 101}), "logit_bias"),
        (dict(logit_bias={-1: 1}), "logit_bias"),
        (dict(min_tokens=-1), "min_tokens"),
        (dict(min_tokens=20, max_tokens=10), "min_tokens"),
        (dict(bad_words_token_ids=[[]]), "bad_words_token_ids"),
        (dict(bad_words_token_ids=[["a"]]), "bad_words_token_ids"),
    ]:
        with pytest.raises(ValueError, match=f"^{name}"):
            SamplingParams(**kwargs)


def test_sparse_penalties_cover_duplicates_overlap_empty_output_and_plain_rows():
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(5, V, generator=g) * 3
    penalties = dict(presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.2)
    params = [
        SamplingParams(**penalties),  # duplicates in the output, a token also in the prompt
        SamplingParams(),  # no processor, between processed rows
        SamplingParams(**penalties),  # empty output: only the prompt's repetition penalty
        SamplingParams(frequency_penalty=0.9),  # no repetition penalty: the prompt is not touched
        SamplingParams(**penalties, logit_bias={9: 2.0}),
    ]
    histories = [
        ([1, 4, 4, 8], [4, 4, 4, 6, 6, 10]),
        ([3], [3, 3]),
        ([5, 5, 7], []),
        ([2, 8], [8, 8, 11]),
        ([9], [9]),
    ]
    got = apply_processors(logits, batch_of(params, histories, eos=EOS))
    for row, p in enumerate(params):
        want = reference_row(logits[row], p, *histories[row], EOS)
        torch.testing.assert_close(got[row], want, rtol=1e-5, atol=1e-5, msg=f"row {row}: {p}")
    assert torch.equal(got[1], logits[1])


def test_in_place_updates_and_returns_the_given_logits():
    logits, histories = random_case(len(ROW_PARAMS), 4)
    kept = apply_processors(logits, batch_of(ROW_PARAMS, histories, eos=EOS))
    updated = apply_processors(logits, batch_of(ROW_PARAMS, histories, eos=EOS), in_place=True)
    assert updated is logits
    assert torch.equal(updated, kept)
