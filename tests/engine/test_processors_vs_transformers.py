"""The logits processors against transformers' own: ``RepetitionPenaltyLogitsProcessor``,
``MinNewTokensLengthLogitsProcessor``, ``NoBadWordsLogitsProcessor`` and
``SequenceBiasLogitsProcessor`` (one-token sequences: OpenAI's ``logit_bias``), on random
float32 logits and histories, to float32 rounding.

Bad words match within the output only (vLLM's rule, so a prompt never bans a first token);
transformers matches over the whole ``input_ids``, so it is given the output alone here. The
OpenAI frequency and presence penalties have no transformers processor; their formula is
checked in ``test_logits_processors.py``.
"""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
)

from multilora_studio.engine.sampling.logits_processors import apply_processors
from multilora_studio.engine.sampling_params import SamplingParams
from tests.engine.sampling_rows import batch_of

V = 40
EOS = (2, 7)


def case(seed: int) -> tuple[torch.Tensor, list[int], list[int]]:
    """Logits [V] with both signs, a prompt and an output that repeat some tokens."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(V, generator=g) * 4
    prompt = torch.randint(0, V, (int(torch.randint(1, 10, (1,), generator=g)),), generator=g).tolist()
    output = torch.randint(0, V, (int(torch.randint(0, 12, (1,), generator=g)),), generator=g).tolist()
    return logits, prompt, output


def ours(logits: torch.Tensor, params: SamplingParams, prompt: list[int], output: list[int]) -> torch.Tensor:
    return apply_processors(logits[None], batch_of([params], [(prompt, output)], eos=EOS))[0]


def theirs(processor, logits: torch.Tensor, input_ids: list[int]) -> torch.Tensor:
    return processor(torch.tensor([input_ids], dtype=torch.long), logits[None].clone())[0]


@pytest.mark.parametrize("penalty", [1.3, 2.0, 0.7])
@pytest.mark.parametrize("seed", range(6))
def test_repetition_penalty_is_transformers(penalty, seed):
    logits, prompt, output = case(seed)
    expected = theirs(RepetitionPenaltyLogitsProcessor(penalty), logits, prompt + output)
    got = ours(logits, SamplingParams(repetition_penalty=penalty), prompt, output)
    assert not torch.equal(expected, logits), "the case penalises nothing"
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_min_tokens_bans_eos_as_transformers(seed):
    logits, prompt, output = case(seed)
    for min_tokens in (len(output), len(output) + 1, len(output) + 5):
        processor = MinNewTokensLengthLogitsProcessor(len(prompt), min_tokens, list(EOS))
        expected = theirs(processor, logits, prompt + output)
        got = ours(logits, SamplingParams(min_tokens=min_tokens, max_tokens=64), prompt, output)
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("seed", range(8))
def test_bad_words_are_banned_as_transformers_bans_them(seed):
    logits, prompt, output = case(seed)
    tail = output[-2:] if len(output) >= 2 else [5]
    bad = [[11], [3, 9], [*tail, 17], [output[-1] if output else 4, 23]]  # some continue the output
    # the output behind a token outside the vocabulary, which no bad word holds: transformers
    # 5.17 skipped a bad word as long as its whole context ([13, 33, 17] after [13, 33])
    expected = theirs(NoBadWordsLogitsProcessor(bad), logits, [V, *output])
    got = ours(logits, SamplingParams(bad_words_token_ids=bad), prompt, output)
    assert torch.equal(got.isinf(), expected.isinf())
    torch.testing.assert_close(got[~got.isinf()], expected[~expected.isinf()], rtol=0, atol=0)


def test_logit_bias_is_a_one_token_sequence_bias():
    logits, prompt, output = case(0)
    bias = {3: 5.0, 8: -2.5, 30: 0.125}
    processor = SequenceBiasLogitsProcessor([[[token], value] for token, value in bias.items()])
    expected = theirs(processor, logits, prompt + output)
    got = ours(logits, SamplingParams(logit_bias=bias), prompt, output)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
