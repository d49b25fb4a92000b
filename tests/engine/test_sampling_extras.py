"""Penalties, logit_bias, min_tokens and bad words through the engine, against HF's logits; what
it refuses, as types that name the field."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from multilora_studio.engine import (
    GrammarFailure,
    InvalidRequest,
    SamplingParams,
    StructuredOutput,
    UnknownAdapter,
)
from tests.engine.processor_reference import reference_row

GREEDY = dict(temperature=0, ignore_eos=True)
PROMPT = "The quick brown fox"


def hf_processed_greedy(peft_reference, adapter, prompt_ids, params, new_tokens, eos):
    """Greedy tokens where each step's HF logits go through ``reference_row`` first."""
    model = peft_reference.model
    output: list[int] = []
    with torch.no_grad():
        for _ in range(new_tokens):
            ids = torch.tensor([prompt_ids + output])
            if adapter is None:
                with model.disable_adapter():
                    logits = model(input_ids=ids).logits[0, -1].float()
            else:
                model.set_adapter(adapter)
                logits = model(input_ids=ids).logits[0, -1].float()
            output.append(int(reference_row(logits, params, prompt_ids, output, eos).argmax()))
    return output


def test_mixed_batch_rows_with_processors_follow_the_reference_and_others_stay_their_own(
    tiny_engine, peft_reference
):
    engine = tiny_engine
    eos = engine.spec.eos_token_ids
    prompts = ["Paris is", PROMPT, "Once upon a time", "1, 2, 3,"]
    adapters = ["tiny-r8-attn", None, "tiny-r4-qv", None]
    plain = [SamplingParams(max_tokens=12, **GREEDY) for _ in prompts]
    processed = [
        plain[0],
        SamplingParams(
            max_tokens=12, presence_penalty=0.8, frequency_penalty=0.6, repetition_penalty=1.5, **GREEDY
        ),
        SamplingParams(max_tokens=12, logit_bias={100: 3.0, 200: 2.5}, bad_words_token_ids=[[300]], **GREEDY),
        plain[3],
    ]
    alone = [
        engine.generate([p], [a], [s])[0].token_ids for p, a, s in zip(prompts, adapters, plain, strict=True)
    ]
    mixed = [o.token_ids for o in engine.generate(prompts, adapters, processed)]
    assert mixed[0] == alone[0] and mixed[3] == alone[3]
    for row in (1, 2):
        ids = engine.encode(prompts[row])
        want = hf_processed_greedy(peft_reference, adapters[row], ids, processed[row], 12, eos)
        assert mixed[row] == want, row
        assert mixed[row] != alone[row], row  # the processors changed this output


def test_frequency_penalty_stops_a_looping_output_from_repeating(tiny_engine):
    engine = tiny_engine
    looped = 1234
    loop = dict(max_tokens=40, logit_bias={looped: 8.0}, **GREEDY)  # a bias that makes greedy loop
    plain = engine.generate([PROMPT], None, SamplingParams(**loop))[0].token_ids
    assert plain == [looped] * 40
    out = engine.generate([PROMPT], None, SamplingParams(frequency_penalty=2.0, **loop))[0].token_ids
    assert out.count(looped) <= 5
    assert Counter(out).most_common(1)[0][1] <= 5


def test_logit_bias_of_100_forces_a_token(tiny_engine):
    engine = tiny_engine
    forced = 1234
    out = engine.generate(
        [PROMPT], ["tiny-r4-qv"], SamplingParams(max_tokens=8, logit_bias={forced: 100}, **GREEDY)
    )
    assert out[0].token_ids == [forced] * 8
    sampled = SamplingParams(max_tokens=8, temperature=1.0, seed=3, logit_bias={forced: 100}, ignore_eos=True)
    assert engine.generate([PROMPT], None, sampled)[0].token_ids == [forced] * 8


def test_min_tokens_generates_past_eos_and_stop_tokens(tiny_engine):
    engine = tiny_engine
    eos = engine.spec.eos_token_ids[0]
    wants_eos = dict(max_tokens=20, temperature=0, logit_bias={eos: 100})  # EOS first, unless masked
    quick = engine.generate([PROMPT], None, SamplingParams(**wants_eos))[0]
    assert quick.token_ids == [eos] and quick.finish_reason == "stop"
    held = engine.generate([PROMPT], None, SamplingParams(min_tokens=5, **wants_eos))[0]
    assert len(held.token_ids) == 6 and held.token_ids[-1] == eos and eos not in held.token_ids[:5]
    assert held.finish_reason == "stop"
    plain = engine.generate([PROMPT], None, SamplingParams(max_tokens=20, **GREEDY))[0].token_ids
    stop = plain[0]
    out = engine.generate(
        [PROMPT], None, SamplingParams(max_tokens=20, stop_token_ids=[stop], min_tokens=3, **GREEDY)
    )[0]
    assert stop not in out.token_ids[:3] and len(out.token_ids) > 3


def test_min_tokens_holds_back_stop_strings(tiny_engine):
    engine = tiny_engine
    plain = engine.generate([PROMPT], None, SamplingParams(max_tokens=10, **GREEDY))[0]
    first_piece = engine.tokenizer.decode(plain.token_ids[:1], skip_special_tokens=True).strip()
    assert first_piece
    stopped = engine.generate([PROMPT], None, SamplingParams(max_tokens=10, stop=[first_piece], **GREEDY))[0]
    assert stopped.finish_reason == "stop" and len(stopped.token_ids) == 1
    held = SamplingParams(max_tokens=10, stop=[first_piece], min_tokens=4, **GREEDY)
    out = engine.generate([PROMPT], None, held)[0]
    assert len(out.token_ids) >= 4 and out.token_ids[:4] == plain.token_ids[:4]


def test_bad_words_ban_a_sequence_and_single_tokens(tiny_engine):
    engine = tiny_engine
    plain = engine.generate([PROMPT], None, SamplingParams(max_tokens=16, **GREEDY))[0].token_ids
    pair = [plain[2], plain[3]]
    out = engine.generate([PROMPT], None, SamplingParams(max_tokens=16, bad_words_token_ids=[pair], **GREEDY))
    ids = out[0].token_ids
    assert ids[:3] == plain[:3] and ids[3] != plain[3]
    assert all(ids[i : i + 2] != pair for i in range(len(ids) - 1))
    single = engine.generate(
        [PROMPT], None, SamplingParams(max_tokens=16, bad_words_token_ids=[[plain[0]]], **GREEDY)
    )
    assert plain[0] not in single[0].token_ids


def test_token_ids_outside_the_vocabulary_are_refused_at_submit(tiny_engine):
    engine = tiny_engine
    vocab = engine.spec.vocab_size
    for params, name in (
        (SamplingParams(logit_bias={vocab: 1.0}), "logit_bias"),
        (SamplingParams(bad_words_token_ids=[[1, vocab]]), "bad_words_token_ids"),
        (SamplingParams(stop_token_ids=[vocab + 5]), "stop_token_ids"),
    ):
        with pytest.raises(InvalidRequest, match=f"^{name} has token ids outside") as refused:
            engine.submit(PROMPT, None, params)
        assert refused.value.field == name  # what a face maps to its own word, never the message


def test_refusals_carry_their_type_and_field(tiny_engine):
    engine = tiny_engine
    with pytest.raises(UnknownAdapter, match="unknown adapter 'nowhere'") as unknown:
        engine.submit(PROMPT, "nowhere", SamplingParams())
    assert unknown.value.field == "adapter"
    for params, field in (
        (SamplingParams(adapter_scale=0.5), "adapter_scale"),  # a base-model request has no LoRA term
        (SamplingParams(structured=StructuredOutput(regex="(")), "structured"),
    ):
        with pytest.raises(InvalidRequest) as refused:
            engine.submit(PROMPT, None, params)
        assert refused.value.field == field, refused.value
    with pytest.raises(InvalidRequest, match="the prompt is empty") as empty:
        engine.submit([], None, SamplingParams())
    assert empty.value.field == "prompt"


def test_a_grammar_that_refuses_every_token_ends_its_request_with_a_grammar_failure(tiny_engine):
    """A regex whose only match needs a byte no token holds: the request ends with reason
    'error' typed as the request's own failure, and the engine goes on."""
    engine = tiny_engine
    params = SamplingParams(max_tokens=4, structured=StructuredOutput(regex="\U00088433"), **GREEDY)
    output = engine.generate([PROMPT], None, params)[0]
    assert output.finish_reason == "error" and output.error_type is GrammarFailure, output
    assert output.error is not None and output.error.startswith("structured output failed")
    after = engine.generate([PROMPT], None, SamplingParams(max_tokens=2, **GREEDY))[0]
    assert after.finish_reason == "length"


def test_logprobs_stay_the_raw_models_next_to_processed_rows(tiny_engine, peft_reference):
    engine = tiny_engine
    forced = 1234
    penalties = dict(
        presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.2, logit_bias={forced: 100}
    )
    params = [
        SamplingParams(max_tokens=5, logprobs=2, **penalties, **GREEDY),
        SamplingParams(max_tokens=5, **penalties, **GREEDY),
    ]
    outputs = engine.generate([PROMPT, "Paris is"], [None, "tiny-r8-attn"], params)
    assert outputs[0].token_ids == [forced] * 5 and outputs[1].token_ids == [forced] * 5
    assert outputs[1].logprobs is None
    ids = engine.encode(PROMPT)
    raw = peft_reference.logprobs(None, ids + outputs[0].token_ids)  # [L + n, V]
    for i, entry in enumerate(outputs[0].logprobs):
        # the raw model's, not the biased distribution's (where the forced token is ~0)
        assert abs(entry.logprob - float(raw[len(ids) + i - 1, forced])) < 1e-4
        assert entry.logprob < -0.5
