"""Penalties, min_p, logit_bias, min_tokens and bad_words through HTTP with the openai client."""

from __future__ import annotations

import openai
import pytest

from multilora_studio.engine import SamplingParams
from multilora_studio.server.sampling import bad_words_token_ids
from tests.server_fixtures import client

PROMPT = "Once upon a time"
CHAT = [{"role": "user", "content": "Tell me about the sea."}]
FORCED = 1234


def test_fields_are_accepted_and_match_the_engine(serve, engine):
    api = client(serve())
    extra = {"ignore_eos": True, "repetition_penalty": 1.4, "min_p": 0.1, "min_tokens": 2}
    loop = {FORCED: 8.0}  # greedy repeats this token until the penalties push it down
    fields = dict(temperature=0, presence_penalty=1.0, frequency_penalty=0.5, max_tokens=8, logit_bias=loop)
    got = api.completions.create(model="tiny-r4-qv", prompt=PROMPT, extra_body=extra, **fields)
    params = SamplingParams(
        max_tokens=8, temperature=0, ignore_eos=True, presence_penalty=1.0, frequency_penalty=0.5,
        repetition_penalty=1.4, min_p=0.1, min_tokens=2, logit_bias=loop,
    )  # fmt: skip
    want = engine.generate([PROMPT], ["tiny-r4-qv"], params)[0]
    plain = engine.generate(
        [PROMPT], ["tiny-r4-qv"], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    )
    assert got.choices[0].text == want.text and want.token_ids != plain[0].token_ids


@pytest.mark.parametrize("route", ["completions", "chat"])
def test_logit_bias_forces_a_token_on_both_routes(serve, engine, route):
    api = client(serve())
    bias = {str(FORCED): 100}
    token_text = engine.tokenizer.decode([FORCED])
    if route == "completions":
        text = (
            api.completions.create(
                model=engine.model_name, prompt=PROMPT, max_tokens=4, temperature=0, logit_bias=bias
            )
            .choices[0]
            .text
        )
    else:
        text = (
            api.chat.completions.create(
                model=engine.model_name, messages=CHAT, max_tokens=4, temperature=0, logit_bias=bias
            )
            .choices[0]
            .message.content
        )
    assert text == engine.tokenizer.decode([FORCED] * 4) and token_text


def test_bad_words_are_tokenized_and_banned(serve, engine):
    api = client(serve())
    plain = api.completions.create(
        model=engine.model_name, prompt=PROMPT, max_tokens=8, temperature=0, extra_body={"ignore_eos": True}
    )
    first = engine.generate([PROMPT], None, SamplingParams(max_tokens=1, temperature=0))[0].token_ids[0]
    word = engine.tokenizer.decode([first])
    assert bad_words_token_ids([word], engine.tokenizer)[0] == [first] or word.startswith(" ")
    banned = api.completions.create(
        model=engine.model_name,
        prompt=PROMPT,
        max_tokens=8,
        temperature=0,
        extra_body={"ignore_eos": True, "bad_words": [word]},
    )
    out = engine.generate(
        [PROMPT], None,
        SamplingParams(max_tokens=8, temperature=0, ignore_eos=True,
                       bad_words_token_ids=bad_words_token_ids([word], engine.tokenizer)),
    )[0]  # fmt: skip
    assert first not in out.token_ids and banned.choices[0].text == out.text != plain.choices[0].text


def test_bad_words_give_the_word_with_and_without_a_leading_space(engine):
    tokenizer = engine.tokenizer
    sequences = bad_words_token_ids(["sea"], tokenizer)
    assert tokenizer.encode("sea", add_special_tokens=False) in sequences
    spaced = tokenizer.encode(" sea", add_special_tokens=False)
    assert (spaced in sequences) == (len(spaced) == len(sequences[0]) and spaced[0] != sequences[0][0])


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"frequency_penalty": -2.5}, "frequency_penalty"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"10": 150}}, "logit_bias"),
        ({"logit_bias": {"999999999": 1}}, "logit_bias"),
        ({"extra_body": {"repetition_penalty": 0}}, "repetition_penalty"),
        ({"extra_body": {"min_p": 2}}, "min_p"),
        ({"extra_body": {"min_tokens": -1}}, "min_tokens"),
        ({"extra_body": {"min_tokens": 10}}, "min_tokens"),
        ({"extra_body": {"bad_words": [""]}}, "bad_words"),
    ],
)
def test_bad_values_are_400_naming_the_field(serve, options, param):
    settings = {"model": "tiny-r4-qv", "prompt": PROMPT, "max_tokens": 4} | options
    with pytest.raises(openai.BadRequestError) as caught:
        client(serve()).completions.create(**settings)
    error = caught.value.body
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
