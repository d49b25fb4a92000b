"""The official openai client against a real server: completions and chat, streamed and not."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from multilora_studio.engine import SamplingParams
from tests.server_fixtures import GREEDY, client

PROMPT = "Once upon a time"
CHAT = [{"role": "user", "content": "Tell me about the sea."}]


def direct(engine, prompt, adapter, max_tokens, **params):
    """What the engine itself answers (greedy, ignoring EOS unless told otherwise)."""
    settings = {"temperature": 0, "ignore_eos": True} | params
    return engine.generate([prompt], [adapter], SamplingParams(max_tokens=max_tokens, **settings))[0]


def test_models_lists_base_and_adapters_with_parent(serve, engine, server_adapters):
    models = client(serve()).models.list().data
    ids = [m.id for m in models]
    assert ids[0] == engine.model_name
    assert sorted(ids[1:]) == sorted(server_adapters)
    for model in models[1:]:
        assert model.model_extra["parent"] == engine.model_name
        assert model.model_extra["root"] == model.id  # a name, never the folder
    assert models[0].model_extra["parent"] is None
    assert client(serve()).models.retrieve("tiny-r8-qo").id == "tiny-r8-qo"


@pytest.mark.parametrize("adapter", ["tiny-r8-all", None])
def test_completion_equals_engine_output(serve, engine, adapter):
    model = adapter or engine.model_name
    response = client(serve()).completions.create(model=model, prompt=PROMPT, max_tokens=12, **GREEDY)
    expected = direct(engine, PROMPT, adapter, 12)
    choice = response.choices[0]
    assert choice.text == expected.text and choice.finish_reason == "length"
    assert response.model == model and response.object == "text_completion"
    assert response.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert response.usage.completion_tokens == 12
    assert response.usage.total_tokens == response.usage.prompt_tokens + 12


def test_streamed_completion_adds_up_to_engine_output(serve, engine):
    stream = client(serve()).completions.create(
        model="tiny-r16-mlp",
        prompt=PROMPT,
        max_tokens=10,
        stream=True,
        stream_options={"include_usage": True},
        **GREEDY,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == direct(engine, PROMPT, "tiny-r16-mlp", 10).text
    finished = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finished == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10


def test_completion_logprobs_name_each_token_by_the_tokenizer(serve, engine):
    response = client(serve()).completions.create(
        model="tiny-r8-all", prompt=PROMPT, max_tokens=6, logprobs=2, **GREEDY
    )
    expected = direct(engine, PROMPT, "tiny-r8-all", 6).token_ids
    assert response.choices[0].logprobs.tokens == [engine.tokenizer.decode([t]) for t in expected]


def test_adapter_scale_in_extra_body_sets_the_adapter_strength(serve, engine):
    """extra_body={"adapter_scale": s} on both routes: the engine's output at that strength; 0 is
    the base model's, and a base-model request with a strength is a 400 naming the field."""
    api = client(serve())
    adapter = "tiny-r8-all"
    half = api.completions.create(
        model=adapter,
        prompt=PROMPT,
        max_tokens=12,
        extra_body={**GREEDY["extra_body"], "adapter_scale": 0.5},
        temperature=0,
    )
    expected = direct(engine, PROMPT, adapter, 12, adapter_scale=0.5)
    assert half.choices[0].text == expected.text
    assert expected.token_ids != direct(engine, PROMPT, adapter, 12).token_ids  # the strength mattered
    off = api.chat.completions.create(
        model=adapter,
        messages=CHAT,
        max_tokens=9,
        extra_body={**GREEDY["extra_body"], "adapter_scale": 0},
        temperature=0,
    )
    base = api.chat.completions.create(model=engine.model_name, messages=CHAT, max_tokens=9, **GREEDY)
    assert off.choices[0].message.content == base.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(
            model=engine.model_name, messages=CHAT, max_tokens=4, extra_body={"adapter_scale": 0.5}
        )
    error = caught.value.body
    assert error["param"] == "adapter_scale" and "needs an adapter" in error["message"], error


def test_chat_equals_engine_output_streamed_and_not(serve, engine):
    api = client(serve())
    expected = direct(engine, CHAT, "tiny-r4-qv", 9)
    whole = api.chat.completions.create(model="tiny-r4-qv", messages=CHAT, max_tokens=9, **GREEDY)
    assert whole.object == "chat.completion"
    assert whole.choices[0].message.role == "assistant"
    assert whole.choices[0].message.content == expected.text
    assert whole.usage.prompt_tokens == len(expected.prompt_token_ids)
    chunks = list(
        api.chat.completions.create(
            model="tiny-r4-qv", messages=CHAT, max_completion_tokens=9, stream=True, **GREEDY
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_n_prompts_seed_and_stop(serve, engine):
    api = client(serve())
    sampled = dict(temperature=0.9, top_p=0.95, seed=5, extra_body={"ignore_eos": True})
    first = api.completions.create(model="tiny-r8-attn", prompt=PROMPT, max_tokens=8, n=3, **sampled)
    again = api.completions.create(model="tiny-r8-attn", prompt=PROMPT, max_tokens=8, n=3, **sampled)
    texts = [c.text for c in sorted(first.choices, key=lambda c: c.index)]
    assert texts == [c.text for c in sorted(again.choices, key=lambda c: c.index)]
    assert len(set(texts)) > 1  # choice i samples with seed + i
    assert first.usage.completion_tokens == 24
    batch = api.completions.create(
        model="tiny-r8-attn", prompt=["Hello", PROMPT], max_tokens=6, n=2, **GREEDY
    )
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert batch.choices[2].text == direct(engine, PROMPT, "tiny-r8-attn", 6).text
    full = direct(engine, PROMPT, "tiny-r8-attn", 30).text
    stop = full[10:13]
    cut = api.completions.create(model="tiny-r8-attn", prompt=PROMPT, max_tokens=30, stop=[stop], **GREEDY)
    assert cut.choices[0].text == full[: full.find(stop)] and cut.choices[0].finish_reason == "stop"


def test_concurrent_requests_for_different_adapters_match_the_engine(serve, engine, server_adapters):
    api = client(serve())
    jobs = [(name, f"Prompt number {i} about {name}") for i, name in enumerate([*server_adapters, None])]

    def ask(job):
        name, prompt = job
        return (
            api.completions.create(model=name or engine.model_name, prompt=prompt, max_tokens=16, **GREEDY)
            .choices[0]
            .text
        )

    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(ask, jobs))
    expected = engine.generate(
        [p for _, p in jobs],
        [n for n, _ in jobs],
        SamplingParams(max_tokens=16, temperature=0, ignore_eos=True),
    )
    assert answers == [e.text for e in expected]
    assert len(set(answers)) == len(answers)


def test_unknown_model_is_404_never_the_base(serve):
    api = client(serve())
    with pytest.raises(openai.NotFoundError) as caught:
        api.completions.create(model="no-such-adapter", prompt=PROMPT, max_tokens=4)
    error = caught.value.body
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert error["type"] == "not_found_error" and "no-such-adapter" in error["message"]
    with pytest.raises(openai.NotFoundError):
        api.chat.completions.create(model="base", messages=CHAT, stream=True)


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"logprobs": 21}, "logprobs"),
        ({"extra_body": {"prompt_logprobs": -1}}, "prompt_logprobs"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"n": 200}, "n"),
        ({"prompt": "word " * 1100}, "prompt"),
        ({"prompt": [10**9]}, "prompt"),
        ({"extra_body": {"adapter_scale": -0.5}}, "adapter_scale"),
        ({"extra_body": {"adapter_scale": 17}}, "adapter_scale"),
        ({"extra_body": {"adapter_scale": "strong"}}, "adapter_scale"),
    ],
)
def test_bad_parameters_are_400_with_the_parameter_named(serve, options, param):
    settings = {"model": "tiny-r4-qv", "prompt": PROMPT, "max_tokens": 4} | options
    with pytest.raises(openai.BadRequestError) as caught:
        client(serve()).completions.create(**settings)
    error = caught.value.body
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert error["message"]
