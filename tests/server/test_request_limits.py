"""Stop strings, seeds, top_p 0 and the context window, through the official client."""

from __future__ import annotations

import openai
import pytest

from multilora_studio.engine import SamplingParams
from multilora_studio.server.schemas import MAX_STOP, MAX_STOP_CHARS
from tests.server_fixtures import GREEDY, client

PROMPT = "Once upon a time"
MODEL = "tiny-r4-qv"


def greedy_text(engine, prompt, max_tokens):
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    return engine.generate([prompt], [MODEL], params)[0].text


def test_a_stop_string_longer_than_the_list_limit_is_honoured(serve, engine):
    full = greedy_text(engine, PROMPT, 40)
    stop = full[len(full) // 3 : len(full) // 3 + MAX_STOP + 4]
    assert len(stop) > MAX_STOP and full.count(stop) >= 1
    api = client(serve())
    for given in (stop, [stop]):
        cut = api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, stop=given, **GREEDY)
        assert cut.choices[0].text == full[: full.find(stop)] and cut.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    "stop",
    [[f"s{i}" for i in range(MAX_STOP + 1)], "x" * (MAX_STOP_CHARS + 1), ["ok", "y" * (MAX_STOP_CHARS + 1)]],
)
def test_too_many_or_too_long_stop_strings_are_400(serve, stop):
    with pytest.raises(openai.BadRequestError) as caught:
        client(serve()).completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, stop=stop)
    assert caught.value.body["param"] == "stop"


def test_negative_seed_is_accepted_and_maps_into_the_engine_range(serve):
    api = client(serve())

    def sample(seed):
        reply = api.completions.create(
            model=MODEL,
            prompt=PROMPT,
            max_tokens=10,
            temperature=1.0,
            seed=seed,
            extra_body={"ignore_eos": True},
        )
        return reply.choices[0].text

    negative = sample(-7)
    assert negative == sample(-7)  # deterministic
    assert negative == sample(-7 % 2**63)  # documented mapping: seed mod 2**63
    assert sample(-(2**63)) == sample(0)


def test_top_p_zero_is_greedy(serve, engine):
    api = client(serve())
    reply = api.completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=10,
        temperature=1.0,
        top_p=0,
        seed=3,
        extra_body={"ignore_eos": True},
    )
    assert reply.choices[0].text == greedy_text(engine, PROMPT, 10)


def _context_error(call, **options):
    with pytest.raises(openai.BadRequestError) as caught:
        call(**options)
    return caught.value.body


def test_max_tokens_beyond_the_context_is_400_naming_it(serve, engine):
    api = client(serve())
    limit = engine.config.max_model_len
    prompt_ids = engine.encode("word " * 600)
    room = limit - len(prompt_ids)
    fits = api.completions.create(model=MODEL, prompt=prompt_ids, max_tokens=room, **GREEDY)
    assert fits.usage.prompt_tokens + fits.usage.completion_tokens == limit
    assert fits.choices[0].finish_reason == "length"
    error = _context_error(api.completions.create, model=MODEL, prompt=prompt_ids, max_tokens=room + 1)
    assert error["param"] == "max_tokens"
    assert str(limit) in error["message"] and str(room + 1) in error["message"]
    assert str(len(prompt_ids)) in error["message"]
    chat = [{"role": "user", "content": "word " * 600}]
    chat_room = limit - len(engine.encode([dict(m) for m in chat]))
    for field in ("max_tokens", "max_completion_tokens"):
        error = _context_error(
            api.chat.completions.create, model=MODEL, messages=chat, **{field: chat_room + 1}
        )
        assert (
            error["param"] == field
            and str(limit) in error["message"]
            and str(chat_room + 1) in error["message"]
        )


def test_chat_without_max_tokens_fills_the_context_and_ends_with_length(serve, engine):
    api = client(serve())
    limit = engine.config.max_model_len
    words = limit - 8 - (len(engine.encode([{"role": "user", "content": "word " * 100}])) - 100)
    chat = [{"role": "user", "content": "word " * words}]
    prompt_tokens = len(engine.encode(chat))
    assert limit - 20 < prompt_tokens < limit, prompt_tokens  # a few tokens of room are enough to test
    whole = api.chat.completions.create(model=MODEL, messages=chat, **GREEDY)
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.prompt_tokens + whole.usage.completion_tokens == limit
    streamed = list(api.chat.completions.create(model=MODEL, messages=chat, stream=True, **GREEDY))
    assert streamed[-1].choices[0].finish_reason == "length"
