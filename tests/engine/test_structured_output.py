"""Structured output on the real engine (tiny model): grammars compile once, constrained rows
match their grammar, unconstrained rows of the same batch stay exactly their own."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from multilora_studio.engine import SamplingParams, StructuredOutput
from multilora_studio.engine.sampling.grammar import lark_json
from multilora_studio.engine.step.device_setup import kv_bytes_per_block

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "ok": {"type": "boolean"},
        "size": {"enum": ["s", "m", "l"]},
    },
    "required": ["name", "ok", "size"],
    "additionalProperties": False,
}
REGEX = r"[a-z]{2,5}-[0-9]{1,3}"
CHOICES = ("red", "green", "blue")
JSON = StructuredOutput(json_schema=json.dumps(SCHEMA))


def constrained(spec: StructuredOutput, **params) -> SamplingParams:
    settings = dict(max_tokens=80, temperature=0)
    settings.update(params)
    return SamplingParams(structured=spec, **settings)


def check_matches(spec: StructuredOutput, text: str) -> None:
    """``text`` is an output ``spec`` allows."""
    if spec.json_schema is not None:
        jsonschema.validate(json.loads(text), json.loads(spec.json_schema))
    elif spec.json_object:
        assert isinstance(json.loads(text), dict)
    elif spec.regex is not None:
        assert re.fullmatch(spec.regex, text), text
    else:
        assert spec.choice is not None and text in spec.choice


def test_a_spec_compiles_once_and_bad_specs_are_value_errors(make_engine):
    engine = make_engine(adapters=[])
    grammars = engine.worker.grammars
    before = grammars.compiles
    for _ in range(3):
        engine.submit("Hello", None, constrained(JSON, max_tokens=2)).result()
    assert grammars.compiles == before + 1
    engine.submit("Hello", None, constrained(StructuredOutput(json_schema=json.dumps(SCHEMA)), max_tokens=2))
    assert grammars.compiles == before + 1  # an equal spec is the same cache entry
    engine.submit("Hello", None, constrained(StructuredOutput(regex=REGEX), max_tokens=2)).result()
    assert grammars.compiles == before + 2
    bad = [
        (StructuredOutput(json_schema='{"type": "objekt"}'), "JSON schema.*objekt"),
        (StructuredOutput(json_schema="{not json"), "JSON schema"),
        (StructuredOutput(regex="[a-z"), "regex.*unclosed"),
        (StructuredOutput(lark="start: missing_rule"), "Lark grammar.*missing_rule"),
        (StructuredOutput(lark='start: "a" %json{"type": "objekt"}'), "Lark grammar.*objekt"),
    ]
    for spec, message in bad:
        with pytest.raises(ValueError, match=f"(?s){message}"):
            engine.submit("Hello", None, constrained(spec))
    # the engine still serves
    assert engine.generate(["Hello"], None, SamplingParams(max_tokens=3, temperature=0))[0].finish_reason


def test_mixed_batch_keeps_free_rows_exact_and_constrained_rows_valid(tiny_engine):
    engine = tiny_engine
    free = [
        ("Once upon a time", "tiny-r8-all", SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)),
        ("The weather today", None, SamplingParams(max_tokens=30, temperature=0.9, seed=3, ignore_eos=True)),
        ("A list of fruit", "tiny-r4-qv", SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)),
    ]
    alone = [engine.generate([p], [a], s)[0].token_ids for p, a, s in free]
    specs = [JSON, StructuredOutput(regex=REGEX), StructuredOutput(choice=CHOICES), JSON]
    sampled = dict(temperature=1.0, seed=11)
    tied = [
        ("Give me JSON", None, constrained(specs[0])),
        ("An id", "tiny-r16-mlp", constrained(specs[1])),
        ("Pick a colour", "tiny-r8-all", constrained(specs[2])),
        ("More JSON", "tiny-r4-qv", constrained(specs[3], **sampled)),
    ]
    batch = [free[0], tied[0], free[1], tied[1], tied[2], free[2], tied[3]]
    outputs = engine.generate([r[0] for r in batch], [r[1] for r in batch], [r[2] for r in batch])
    assert [outputs[i].token_ids for i in (0, 2, 5)] == alone
    for output, spec in zip([outputs[i] for i in (1, 3, 4, 6)], specs, strict=True):
        assert output.finish_reason == "stop", output.text
        check_matches(spec, output.text)


NUMBER = {
    "type": "object",
    "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["x"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    "spec",
    [
        StructuredOutput(lark='start: "id=" NUM ";"\nNUM: /[0-9]{1,4}/'),
        StructuredOutput(lark=f'start: "call " obj\nobj: {lark_json(NUMBER)}'),
    ],
    ids=["lark", "lark_with_json"],
)
def test_lark_grammars_constrain_the_output(tiny_engine, spec):
    engine = tiny_engine
    output = engine.generate(["Write it"], None, constrained(spec, max_tokens=120))[0]
    assert output.finish_reason == "stop", output.text
    if "%json" in (spec.lark or ""):
        assert output.text.startswith("call ")
        jsonschema.validate(json.loads(output.text[5:]), NUMBER)
    else:
        assert re.fullmatch(r"id=[0-9]{1,4};", output.text), output.text


def test_logprobs_stay_the_models_and_n_copies_each_follow_the_grammar(tiny_engine):
    engine = tiny_engine
    spec = StructuredOutput(choice=CHOICES)
    free = engine.generate(["Pick"], None, SamplingParams(max_tokens=1, temperature=0, logprobs=3))[0]
    tied = engine.generate(["Pick"], None, constrained(spec, logprobs=3))[0]
    # the first token's top alternatives are the unconstrained model's, whatever the mask allowed
    assert tied.logprobs[0].top == free.logprobs[0].top
    assert tied.text in CHOICES
    copies = engine.generate(
        ["Pick"] * 6, None, [constrained(spec, temperature=1.0, seed=s) for s in range(6)]
    )
    assert all(c.text in CHOICES and c.finish_reason == "stop" for c in copies)


def test_preempted_constrained_requests_still_match(make_engine, tiny_engine):
    prompts = [f"Record number {i}: write it down as" for i in range(8)]
    digits = {"type": "array", "items": {"enum": [0, 1, 2]}, "minItems": 25, "maxItems": 25}
    specs = [
        StructuredOutput(json_schema=json.dumps(digits)),
        StructuredOutput(regex="([a-z] ){40}[a-z]"),
    ] * 4
    params = [constrained(spec, max_tokens=120) for spec in specs]
    roomy = tiny_engine
    expected = [o.token_ids for o in roomy.generate(prompts, None, params)]
    block_bytes = kv_bytes_per_block(roomy.spec, roomy.config.block_size, torch.float32)
    tight = make_engine(adapters=[], kv_cache_memory_gb=20 * block_bytes / 2**30)
    outputs = tight.generate(prompts, None, params)
    assert tight.metrics(fresh=True).preemptions > 0
    assert [o.token_ids for o in outputs] == expected
    for output, spec in zip(outputs, specs, strict=True):
        check_matches(spec, output.text)


def test_aborting_a_constrained_request_frees_it(tiny_engine):
    engine = tiny_engine
    spec = StructuredOutput(regex="[a-z]{300}")
    stream = engine.submit("Letters", None, constrained(spec, max_tokens=200))
    iterator = iter(stream)
    next(iterator)
    engine.abort(stream.request_id)
    assert list(iterator)[-1].finish_reason == "abort"
    metrics = engine.metrics(fresh=True)
    assert metrics.kv_blocks_free == metrics.kv_blocks_total
    again = engine.generate(["Letters"], None, constrained(StructuredOutput(regex="[a-z]{3}")))[0]
    assert re.fullmatch("[a-z]{3}", again.text)


def test_a_choice_the_tokenizer_cannot_write_is_refused_at_submission(tiny_engine):
    """Byte 0xF2, the first of U+88433's four, has no token in this tokenizer: the choice
    naming that character is refused by name before it runs, the others are served."""
    refused = StructuredOutput(choice=("ok", "\U00088433"))
    with pytest.raises(ValueError, match="no token of this model's tokenizer writes"):
        tiny_engine.generate([[1, 2]], [None], constrained(refused))
    fine = StructuredOutput(choice=("ok", "é"))
    out = tiny_engine.generate([[1, 2]], [None], constrained(fine))[0]
    check_matches(fine, tiny_engine.tokenizer.decode(out.token_ids, skip_special_tokens=True))
