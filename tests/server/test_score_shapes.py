"""Log-probabilities, echo and prompt_logprobs in OpenAI's and vLLM's shapes, through the openai client."""

from __future__ import annotations

import openai
import pytest

from multilora_studio.engine import SamplingParams
from tests.server_fixtures import GREEDY, client

PROMPT = "Once upon a time"
CHAT = [{"role": "user", "content": "Tell me about the sea."}]
MODEL = "tiny-r8-all"


def generated(engine, prompt, max_tokens, adapter=MODEL):
    """The engine's own greedy token ids for ``prompt``."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    return engine.generate([prompt], [adapter], params)[0].token_ids


def strings(engine, ids):
    return [engine.tokenizer.decode([token]) for token in ids]


def offsets(tokens, start=0):
    found = []
    for token in tokens:
        found.append(start)
        start += len(token)
    return found


def check_legacy(logprobs, tokens, top, greedy=True):
    """OpenAI's legacy shape for scored ``tokens``: top_logprobs maps the k best, then the chosen one."""
    assert logprobs.tokens == tokens
    assert len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == len(tokens)
    for token, value, alternatives in zip(
        tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True
    ):
        assert value <= 0 and alternatives[token] == value
        assert 1 <= len(alternatives) <= top + 1
        if greedy:
            assert value == max(alternatives.values())


def test_completion_logprobs_in_openais_legacy_shape(serve, engine):
    api = client(serve())
    answer = api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, logprobs=3, **GREEDY)
    choice = answer.choices[0]
    tokens = strings(engine, generated(engine, PROMPT, 5))
    check_legacy(choice.logprobs, tokens, 3)
    assert all(len(alternatives) == 3 for alternatives in choice.logprobs.top_logprobs)
    assert choice.logprobs.text_offset == offsets(tokens)
    only_own = api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, logprobs=0, **GREEDY)
    assert only_own.choices[0].logprobs.token_logprobs == choice.logprobs.token_logprobs
    assert [list(top) for top in only_own.choices[0].logprobs.top_logprobs] == [[t] for t in tokens]
    plain = api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, **GREEDY)
    assert plain.choices[0].logprobs is None and plain.choices[0].text == choice.text
    assert "prompt_logprobs" not in (plain.choices[0].model_extra or {})


def test_echo_returns_the_prompt_scored_first_token_null(serve, engine):
    api = client(serve())
    ids = engine.encode(PROMPT)
    answer = api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, logprobs=1, echo=True, **GREEDY)
    choice = answer.choices[0]
    completion = generated(engine, PROMPT, 2)
    assert choice.text == PROMPT + engine.tokenizer.decode(completion)
    logprobs = choice.logprobs
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    tokens = strings(engine, ids + completion)
    assert logprobs.tokens == tokens and logprobs.text_offset == offsets(tokens)
    rest = type(logprobs)(
        tokens=tokens[1:], token_logprobs=logprobs.token_logprobs[1:], top_logprobs=logprobs.top_logprobs[1:]
    )
    check_legacy(rest, tokens[1:], 1, greedy=False)  # prompt tokens need not be the most likely
    text_only = api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, echo=True, **GREEDY)
    assert text_only.choices[0].text == choice.text and text_only.choices[0].logprobs is None


@pytest.mark.parametrize("stream", [False, True])
def test_echo_with_no_new_tokens_returns_the_scored_prompt_only(serve, engine, stream):
    api = client(serve())
    settings = dict(model=MODEL, prompt=PROMPT, max_tokens=0, logprobs=2, echo=True, **GREEDY)
    with_one = api.completions.create(**(settings | {"max_tokens": 1})).choices[0]
    if stream:
        chunks = [c.choices[0] for c in api.completions.create(stream=True, **settings) if c.choices]
        assert len(chunks) == 1
        choice = chunks[0]
    else:
        answer = api.completions.create(**settings)
        assert answer.usage.completion_tokens == 0
        choice = answer.choices[0]
    assert choice.text == PROMPT and choice.finish_reason == "length"
    prompt_part = with_one.logprobs.model_dump()
    assert choice.logprobs.model_dump() == {name: values[:-1] for name, values in prompt_part.items()}


def test_lm_eval_request_batch_of_token_ids(serve, engine):
    """What lm-evaluation-harness sends for log-likelihoods: id prompts, echo, one token, logprobs 1."""
    prompts = [engine.encode("The capital of France is Paris"), engine.encode("Two plus two is four")]
    answer = client(serve()).completions.create(
        model=MODEL, prompt=prompts, max_tokens=1, logprobs=1, echo=True, temperature=0, seed=1234
    )
    assert [c.index for c in answer.choices] == [0, 1]
    for choice, ids in zip(answer.choices, prompts, strict=True):
        assert choice.text.startswith(engine.tokenizer.decode(ids))
        assert len(choice.logprobs.token_logprobs) == len(ids) + 1
        assert choice.logprobs.token_logprobs[0] is None
        assert all(isinstance(v, float) for v in choice.logprobs.token_logprobs[1:])
    assert answer.usage.prompt_tokens == sum(len(ids) for ids in prompts)


def test_streamed_logprobs_add_up_to_the_whole_answer(serve):
    api = client(serve())
    settings = dict(model=MODEL, prompt=PROMPT, max_tokens=6, logprobs=2, echo=True, **GREEDY)
    whole = api.completions.create(**settings).choices[0]
    chunks = [c.choices[0] for c in api.completions.create(stream=True, **settings) if c.choices]
    assert "".join(c.text for c in chunks) == whole.text
    joined = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for chunk in chunks:
        if chunk.logprobs is not None:
            for name, values in joined.items():
                values.extend(getattr(chunk.logprobs, name))
    assert joined == whole.logprobs.model_dump(include=set(joined))


def test_chat_logprobs_in_openais_shape_streamed_and_not(serve, engine):
    api = client(serve())
    whole = api.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=5, logprobs=True, top_logprobs=2, **GREEDY
    ).choices[0]
    tokens = strings(engine, generated(engine, CHAT, 5))
    content = whole.logprobs.content
    assert [item.token for item in content] == tokens
    for item in content:
        assert item.bytes == list(item.token.encode())
        assert len(item.top_logprobs) == 2 and item.top_logprobs[0].logprob == item.logprob
        assert item.top_logprobs[0].logprob >= item.top_logprobs[1].logprob
        assert item.top_logprobs[0].bytes == list(item.top_logprobs[0].token.encode())
    chunks = api.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=5, logprobs=True, top_logprobs=2, stream=True, **GREEDY
    )
    streamed = [
        item for c in chunks if c.choices and c.choices[0].logprobs for item in c.choices[0].logprobs.content
    ]
    assert [item.model_dump() for item in streamed] == [item.model_dump() for item in content]
    own = api.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5, logprobs=True, **GREEDY)
    assert [item.top_logprobs for item in own.choices[0].logprobs.content] == [[]] * 5
    plain = api.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5, **GREEDY)
    assert plain.choices[0].logprobs is None
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2, top_logprobs=2)
    assert caught.value.body["param"] == "top_logprobs"


def check_prompt_logprobs(scores, ids, top):
    """vLLM's shape: null, then for each token {id: {logprob, rank, decoded_token}}, the token first."""
    assert len(scores) == len(ids) and scores[0] is None
    for token, entry in zip(ids[1:], scores[1:], strict=True):
        first = next(iter(entry))
        assert first == str(token) and entry[first]["rank"] >= 1
        ranks = sorted(value["rank"] for key, value in entry.items() if key != first)
        if entry[first]["rank"] <= top:
            ranks = sorted([*ranks, entry[first]["rank"]])
        assert ranks == list(range(1, top + 1))
        assert all(
            isinstance(value["decoded_token"], str) and value["logprob"] <= 0 for value in entry.values()
        )


def test_prompt_logprobs_in_vllms_shape_on_both_routes(serve, engine):
    api = client(serve())
    ids = engine.encode(PROMPT)
    answer = api.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=2, extra_body={"prompt_logprobs": 2, "ignore_eos": True}
    )
    check_prompt_logprobs(answer.choices[0].model_extra["prompt_logprobs"], ids, 2)
    assert answer.choices[0].logprobs is None
    chunks = api.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=2, stream=True, extra_body={"prompt_logprobs": 2}
    )
    carried = [
        c.choices[0].model_extra["prompt_logprobs"]
        for c in chunks
        if c.choices and c.choices[0].model_extra.get("prompt_logprobs")
    ]
    assert carried == [answer.choices[0].model_extra["prompt_logprobs"]]
    chat = api.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=2, extra_body={"prompt_logprobs": 0}
    )
    check_prompt_logprobs(chat.model_extra["prompt_logprobs"], engine.encode(CHAT), 0)
    assert chat.choices[0].model_extra["prompt_logprobs"] == chat.model_extra["prompt_logprobs"]
