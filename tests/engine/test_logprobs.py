"""Log-probabilities of generated and prompt tokens equal log_softmax of PEFT's logits, adapter by adapter."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from multilora_studio.engine import SamplingParams, TokenLogprob
from multilora_studio.engine.sampling.logprobs import (
    PromptScores,
    score_chunk_rows,
    score_hidden_rows,
    score_rows,
)
from tests.fixtures import TINY_ADAPTERS

TOLERANCE = 1e-4  # float32 engine vs float32 PEFT
PROMPTS = [
    "Once upon a time",
    "The quick brown fox jumps over the lazy dog and then",
    "def fibonacci(n):",
    "A short poem about the sea: the waves roll in, the gulls cry, and the sand",
]
TOP = 5


def check_entry(entry: TokenLogprob, reference_row, token: int, k: int) -> None:
    """One engine entry against a reference row [V] of log-probabilities."""
    assert entry.token_id == token
    assert abs(entry.logprob - float(reference_row[token])) < TOLERANCE
    assert (
        entry.rank == int((reference_row > reference_row[token]).sum()) + 1
        or abs(float(reference_row.sort(descending=True).values[entry.rank - 1]) - entry.logprob) < TOLERANCE
    )  # a tie at the token's value may rank it either way
    assert len(entry.top) == k
    values = reference_row.topk(k).values.tolist() if k else []
    for (top_id, top_lp), value in zip(entry.top, values, strict=True):
        assert abs(top_lp - value) < TOLERANCE
        assert abs(float(reference_row[top_id]) - top_lp) < TOLERANCE  # the id carries that value


def check_request(peft_reference, adapter, prompt_ids, output, params) -> None:
    reference = peft_reference.logprobs(adapter, prompt_ids + output.token_ids)  # [L + n, V]
    if params.logprobs is None:
        assert output.logprobs is None
    else:
        assert len(output.logprobs) == len(output.token_ids)
        for i, (entry, token) in enumerate(zip(output.logprobs, output.token_ids, strict=True)):
            check_entry(entry, reference[len(prompt_ids) + i - 1], token, params.logprobs)
    if params.prompt_logprobs is None:
        assert output.prompt_logprobs is None
    else:
        assert len(output.prompt_logprobs) == len(prompt_ids) and output.prompt_logprobs[0] is None
        for position in range(1, len(prompt_ids)):
            entry = output.prompt_logprobs[position]
            check_entry(entry, reference[position - 1], prompt_ids[position], params.prompt_logprobs)


def test_mixed_batch_logprobs_match_peft_for_every_adapter(tiny_engine, peft_reference):
    engine = tiny_engine
    names: list[str | None] = [spec.name for spec in TINY_ADAPTERS] + [None]
    kinds = [
        SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=TOP, prompt_logprobs=2),
        SamplingParams(max_tokens=6, temperature=0, ignore_eos=True),  # asks for none: gets none
        SamplingParams(max_tokens=6, temperature=0.9, seed=3, ignore_eos=True, logprobs=0),
        SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, prompt_logprobs=0),
    ]
    requests = [
        (engine.encode(PROMPTS[i % len(PROMPTS)]), name, kinds[i % len(kinds)])
        for i, name in enumerate(names * 2)
    ]
    outputs = engine.generate([r[0] for r in requests], [r[1] for r in requests], [r[2] for r in requests])
    for (prompt_ids, adapter, params), output in zip(requests, outputs, strict=True):
        check_request(peft_reference, adapter, prompt_ids, output, params)


def test_long_prompts_are_scored_in_chunked_prefill_and_streamed(make_engine, peft_reference):
    # 32-token step budget: a 300-token prompt is prefilled in ten chunks, beside a request that asks nothing
    engine = make_engine(max_num_batched_tokens=32, max_num_seqs=4, max_model_len=512)
    long_ids = (engine.encode(PROMPTS[3]) * 20)[:300]
    scored = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True, prompt_logprobs=TOP, logprobs=1)
    plain = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    adapter = TINY_ADAPTERS[1].name
    other = engine.submit(engine.encode(PROMPTS[0]), TINY_ADAPTERS[0].name, plain)
    deltas = list(engine.stream(long_ids, adapter, scored))
    plain_output = other.result(timeout=600)
    assert plain_output.logprobs is None and plain_output.prompt_logprobs is None
    firsts = [d for d in deltas if d.prompt_logprobs is not None]
    assert len(firsts) == 1 and firsts[0].token_ids  # the prompt's scores come once, with the first token
    prompt_logprobs = list(firsts[0].prompt_logprobs)
    tokens = [t for d in deltas for t in d.token_ids]
    logprobs = [e for d in deltas for e in d.logprobs]
    assert len(logprobs) == len(tokens) == 3
    streamed = SimpleNamespace(token_ids=tokens, logprobs=logprobs, prompt_logprobs=prompt_logprobs)
    check_request(peft_reference, adapter, long_ids, streamed, scored)


def test_score_gives_prompt_logprobs_without_generating(tiny_engine, peft_reference):
    engine = tiny_engine
    prompts = [engine.encode(text) for text in PROMPTS[:3]]
    adapters = [TINY_ADAPTERS[2].name, None, TINY_ADAPTERS[0].name]
    outputs = engine.score(prompts, adapters, top_k=3)
    for prompt_ids, adapter, output in zip(prompts, adapters, outputs, strict=True):
        assert output.token_ids == [] and output.text == "" and output.finish_reason == "length"
        check_request(peft_reference, adapter, prompt_ids, output, SamplingParams(prompt_logprobs=3))


def test_a_prompt_only_request_streams_one_final_delta_with_its_scores(tiny_engine, peft_reference):
    engine = tiny_engine
    prompt_ids = engine.encode(PROMPTS[1])
    adapter = TINY_ADAPTERS[1].name
    neighbour = engine.submit(PROMPTS[0], TINY_ADAPTERS[0].name, SamplingParams(max_tokens=8, temperature=0))
    deltas = list(engine.stream(prompt_ids, adapter, SamplingParams(max_tokens=0, prompt_logprobs=2)))
    assert [(d.token_ids, d.finished, d.finish_reason) for d in deltas] == [([], True, "length")]
    scored = SimpleNamespace(token_ids=[], logprobs=None, prompt_logprobs=list(deltas[0].prompt_logprobs))
    check_request(peft_reference, adapter, prompt_ids, scored, SamplingParams(prompt_logprobs=2))
    assert len(neighbour.result(timeout=600).token_ids) == 8  # the batch it ran in is unaffected


@pytest.mark.parametrize("field", ["logprobs", "prompt_logprobs"])
def test_logprob_counts_are_validated(field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: 21})
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: -1})


def test_prompt_rows_are_scored_a_chunk_at_a_time_with_the_same_result():
    generator = torch.Generator().manual_seed(0)
    head = torch.randn(300, 16, generator=generator)  # [V, H]
    hidden = torch.randn(10, 16, generator=generator)  # [R, H]
    targets = torch.randint(0, 300, (10,), generator=generator)
    widths: list[int] = []
    firsts: list[int] = []

    def logits_of(rows: torch.Tensor, first: int) -> torch.Tensor:
        widths.append(len(rows))
        firsts.append(first)
        return rows @ head.T  # [r, V]

    chunked = score_hidden_rows(logits_of, hidden, targets, 4, chunk_rows=3)
    assert widths == [3, 3, 3, 1]
    assert firsts == [0, 3, 6, 9]
    whole = score_hidden_rows(logits_of, hidden, targets, 4, chunk_rows=10)
    ranks_and_ids = [1, *range(2, 6)]  # the columns of rank and the top ids
    assert torch.equal(chunked.packed[:, ranks_and_ids], whole.packed[:, ranks_and_ids])
    assert torch.allclose(chunked.packed, whole.packed, atol=1e-5, rtol=0)  # a GEMM's rows may round apart
    assert score_chunk_rows(128256, torch.bfloat16) == 1046 and score_chunk_rows(49152, torch.float32) == 1365


def test_prompt_scores_read_as_one_sequence_across_the_steps_that_scored_them():
    logits = torch.randn(5, 40, generator=torch.Generator().manual_seed(1))  # positions 0..4
    targets = [3, 9, 27, 1, 39]  # prompt tokens 1..5
    whole = score_rows(logits, torch.tensor(targets), 4)
    parts = [whole.rows(slice(0, 2)), whole.rows(slice(2, 5))]  # two prefill chunks
    scores = PromptScores(parts, targets, 2)
    expected = [None, *whole.entries([2] * 5, targets)]
    assert len(scores) == 6 and scores[0] is None and scores == expected and list(scores) == expected
    assert [entry.token_id for entry in scores[1:]] == targets and all(len(e.top) == 2 for e in scores[1:])
    assert scores[-1] == expected[-1] and scores != expected[:-1]
