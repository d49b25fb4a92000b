"""Per-request adapter strength (``SamplingParams.adapter_scale``) in one mixed batch, against PEFT."""

from __future__ import annotations

import pytest

from multilora_studio.engine import SamplingParams
from multilora_studio.engine.sampling_params import MAX_ADAPTER_SCALE
from tests.engine.test_logprobs import check_entry

NEW_TOKENS = 12
SCALED = "tiny-r8-all"  # every projection targeted: each fused path sees the strength
PROMPTS = [
    "Once upon a time",
    "The quick brown fox jumps over the lazy dog and then",
    "def fibonacci(n):",
    "Paris is the capital of",
    "1, 2, 3,",
]


def greedy(scale: float = 1.0, logprobs: int | None = None) -> SamplingParams:
    return SamplingParams(
        max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True, adapter_scale=scale, logprobs=logprobs
    )


# (prompt, adapter, strength): the same adapter at 0 / 0.5 / 1 / 2 (two prompts at 0.5), other
# adapters and base rows, all in one batch
REQUESTS = [
    (0, SCALED, 0.0),
    (1, SCALED, 0.5),
    (2, SCALED, 1.0),
    (3, SCALED, 0.5),
    (4, SCALED, 2.0),
    (0, "tiny-r4-qv", 1.0),
    (1, "tiny-r32-ko-down", 1.0),
    (2, None, 1.0),
    (1, None, 1.0),
]


@pytest.mark.parametrize("shrink_in_gemm", [False, True], ids=["kernel-shrink", "shrink-in-gemm"])
def test_mixed_strengths_in_one_batch_match_peft(make_engine, peft_reference, shrink_in_gemm):
    """Strength 0 is the base token for token, 1 the adapter, 0.5 and 2 PEFT with the adapter's
    scaling multiplied by that factor (tokens and log-probabilities), one slot for the adapter."""
    adapters = sorted({a for _, a, _ in REQUESTS if a is not None})
    # as many slots as distinct adapters: a strength that took a slot of its own could not run
    engine = make_engine(adapters=adapters, max_loras=len(adapters), lora_shrink_in_gemm=shrink_in_gemm)
    prompts = [engine.encode(PROMPTS[i]) for i, _, _ in REQUESTS]
    params = [greedy(scale, logprobs=2) for _, _, scale in REQUESTS]
    started = engine.step_trace.snapshot()[-1].start if engine.step_trace.snapshot() else 0.0
    outputs = engine.generate(prompts, [a for _, a, _ in REQUESTS], params)
    steps = [r for r in engine.step_trace.snapshot() if r.start > started]
    assert max(r.sequences for r in steps) == len(REQUESTS)  # one batch
    assert max(r.lora_sequences for r in steps) == 7  # the base rows run without an adapter
    slots = engine.metrics(fresh=True).slots
    assert [s.adapter for s in slots].count(SCALED) == 1
    for prompt, (_, adapter, scale), output in zip(prompts, REQUESTS, outputs, strict=True):
        reference_adapter = None if scale == 0 else adapter
        expected = peft_reference.greedy(reference_adapter, prompt, NEW_TOKENS, scale if scale else 1.0)
        assert output.token_ids == expected, (adapter, scale)
        rows = peft_reference.logprobs(reference_adapter, prompt + output.token_ids, scale if scale else 1.0)
        for i, (entry, token) in enumerate(zip(output.logprobs, output.token_ids, strict=True)):
            check_entry(entry, rows[len(prompt) + i - 1], token, 2)
    # the strength matters: at half strength the adapter's tokens differ from its full-strength ones
    half = outputs[REQUESTS.index((1, SCALED, 0.5))]
    assert half.token_ids != peft_reference.greedy(SCALED, prompts[1], NEW_TOKENS)


def test_strength_one_is_the_request_without_a_strength(make_engine):
    """adapter_scale=1 is today's request bit for bit: the same tokens and log-probabilities.

    Batch-invariant mode, so that two runs of one batch are the same bits on a GPU too (the
    default kernels there may reduce in another order from run to run).
    """
    engine = make_engine(adapters=[SCALED], batch_invariant=True)
    prompt = engine.encode(PROMPTS[1])
    plain = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True, logprobs=0)
    # the same batch (beside a half-strength row) with and without the field: batch composition
    # alone may change the last bits on a GPU, the field must not
    unscaled = engine.generate([prompt, prompt], [SCALED, SCALED], [plain, greedy(0.5, 0)])[0]
    scaled = engine.generate([prompt, prompt], [SCALED, SCALED], [greedy(1.0, 0), greedy(0.5, 0)])[0]
    assert scaled.token_ids == unscaled.token_ids
    assert [e.logprob for e in scaled.logprobs] == [e.logprob for e in unscaled.logprobs]


def test_adapter_scale_is_validated():
    for bad in (-0.1, MAX_ADAPTER_SCALE + 0.5, float("inf"), float("nan"), "0.5", True, None):
        with pytest.raises(ValueError, match="adapter_scale"):
            SamplingParams(adapter_scale=bad)
    assert SamplingParams(adapter_scale=MAX_ADAPTER_SCALE).adapter_scale == MAX_ADAPTER_SCALE
    assert SamplingParams(adapter_scale=0).adapter_scale == 0.0


def test_a_base_request_with_a_strength_is_refused(make_engine):
    engine = make_engine(adapters=[SCALED])
    with pytest.raises(ValueError, match=r"adapter_scale=0\.5 needs an adapter"):
        engine.submit("Once upon a time", None, greedy(0.5))
    # the engine keeps serving
    assert engine.generate(["Once upon a time"], [None], greedy())[0].token_ids
