"""One request's own work (bad words, logit_bias, grammars) bounded or kept off the event loop:
``/health`` answers during each, oversize fields are 400s naming them, grammar caches have a
byte bound."""

from __future__ import annotations

import json
import random
import string

import openai
import psutil
import pytest

from multilora_studio.engine import SamplingParams
from multilora_studio.engine.sampling.grammar import GrammarCompiler, check_structured
from multilora_studio.engine.sampling.grammar.compile import CHECKED_SPEC_BYTES, checked_specs
from multilora_studio.engine.sampling.grammar.matchers import grammar_bytes
from multilora_studio.engine.sampling.structured import StructuredOutput
from multilora_studio.engine.sampling_params import MAX_BAD_WORDS_TOKENS, MAX_LOGIT_BIAS_TOKENS
from multilora_studio.server.schemas import MAX_BAD_WORD_CHARS, MAX_BAD_WORDS
from tests.security.health_watch import HealthWatch
from tests.server_fixtures import GREEDY, client


def letters(rng: random.Random, count: int) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(count))


def words_of(count: int, chars: int, seed: int = 0) -> list[str]:
    """``count`` words of ``chars`` random letters: hundreds of tokens each."""
    rng = random.Random(seed)
    return [letters(rng, chars) for _ in range(count)]


def choices(count: int, seed: int) -> tuple[str, ...]:
    rng = random.Random(seed)
    return tuple(letters(rng, 12) for _ in range(count))


def test_long_bad_words_with_many_choices_leave_health_up_and_are_refused(serve, engine):
    server = serve()
    api = client(server)
    words = words_of(MAX_BAD_WORDS, MAX_BAD_WORD_CHARS - 24)  # 128 KB of text, each word allowed
    with HealthWatch(server.url) as watch:
        try:
            api.completions.create(
                model=engine.model_name, prompt="Hi", max_tokens=2, n=16, extra_body={"bad_words": words}
            )
            refused = None
        except openai.BadRequestError as error:
            refused = error.body
    watch.check()
    assert refused is not None and refused["param"] == "bad_words"
    assert f"over {MAX_BAD_WORDS_TOKENS} tokens" in refused["message"]


@pytest.mark.parametrize(
    ("words", "param"),
    [
        (["sea"] * (MAX_BAD_WORDS + 1), "bad_words"),
        (["x" * (MAX_BAD_WORD_CHARS + 1)], "bad_words.0"),
    ],
    ids=["too-many", "too-long"],
)
def test_bad_words_past_their_caps_are_refused_naming_the_field(serve, engine, words, param):
    api = client(serve())
    with pytest.raises(openai.BadRequestError) as refused:
        api.completions.create(
            model=engine.model_name, prompt="Hi", max_tokens=2, extra_body={"bad_words": words}
        )
    assert refused.value.body["param"] == param


def test_logit_bias_takes_at_most_openais_300_entries(serve, engine):
    server = serve()
    api = client(server)
    ask = {"model": engine.model_name, "prompt": "Hi", "max_tokens": 2, **GREEDY}
    full = {str(token): -1.0 for token in range(MAX_LOGIT_BIAS_TOKENS)}
    assert api.completions.create(logit_bias=full, **ask).usage.completion_tokens == 2
    every = {str(token): -1.0 for token in range(engine.spec.vocab_size)}  # 49,152 entries
    with HealthWatch(server.url) as watch, pytest.raises(openai.BadRequestError) as refused:
        api.completions.create(logit_bias=every, n=128, **ask)
    watch.check()
    assert refused.value.body["param"] == "logit_bias"
    assert f"at most {MAX_LOGIT_BIAS_TOKENS}" in refused.value.body["message"]


def test_sampling_params_from_python_have_the_same_limits():
    with pytest.raises(ValueError, match=f"logit_bias may hold at most {MAX_LOGIT_BIAS_TOKENS} token ids"):
        SamplingParams(logit_bias={token: 1.0 for token in range(MAX_LOGIT_BIAS_TOKENS + 1)})
    with pytest.raises(ValueError, match=f"at most {MAX_BAD_WORDS_TOKENS} tokens in all"):
        SamplingParams(bad_words_token_ids=[[1] * 600, [2] * 600])


def test_a_large_grammar_is_checked_off_the_event_loop(serve, engine):
    server = serve()
    api = client(server)
    options = choices(50000, seed=7)
    pattern = "(" + "|".join(options) + ")"  # 650 KB: seconds of grammar work
    # the engine's first constraint builds llguidance's view of the tokenizer (once per engine)
    api.completions.create(
        model=engine.model_name, prompt="Pick", max_tokens=1, extra_body={"guided_regex": "a"}
    )
    with HealthWatch(server.url) as watch:
        made = api.completions.create(
            model=engine.model_name, prompt="Pick", max_tokens=3, extra_body={"guided_regex": pattern}
        )
    watch.check()
    assert any(option.startswith(made.choices[0].text) for option in options)


def test_compiled_grammars_are_kept_within_a_byte_bound(engine):
    specs = [StructuredOutput(choice=choices(6000, seed)) for seed in range(4)]
    one = grammar_bytes("x" * specs[0].size)  # about what each is counted at
    compiler = GrammarCompiler(engine.tokenizer, [engine.tokenizer.eos_token_id], max_bytes=2 * one)
    assert compiler.vocab_size == engine.tokenizer.vocab_size  # its tokenizer built before measuring
    process = psutil.Process()
    before = process.memory_info().rss
    compiler.compile(specs[0])
    grew = process.memory_info().rss - before
    assert grew <= compiler.cache.nbytes  # the estimate is not below what one grammar took
    for spec in specs[1:]:
        compiler.compile(spec)
        assert compiler.cache.nbytes <= compiler.cache.max_bytes
    assert len(compiler.cache) < len(specs)
    compiler.matcher(specs[-1])  # the newest is still cached
    assert compiler.compiles == len(specs)


def test_the_validity_check_keeps_specs_within_a_byte_bound():
    described = [{"type": "string", "description": f"{n}" + "x" * (2 << 20)} for n in range(10)]  # 2 MB each
    for schema in described:
        check_structured(StructuredOutput(json_schema=json.dumps(schema)))
    assert 0 < checked_specs.nbytes <= CHECKED_SPEC_BYTES < 10 * (2 << 20)
    assert len(checked_specs) < len(described)
