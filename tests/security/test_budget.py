"""Token budgets: requests reserve their worst case at admission, so none together overshoot a key's
minute, and what a request did not use is refunded when it ends."""

from __future__ import annotations

import openai
import pytest

from tests.server_fixtures import GREEDY, client
from tests.waiting import wait_until

KEY = "sk-budget-0123456789"
MODEL = "tiny-r4-qv"


def _spent(server) -> int:
    return sum(r.prompt_tokens + r.completion_tokens for r in server.state.request_log.records())


def test_a_request_larger_than_the_budget_is_refused_at_once(serve):
    server = serve(api_keys=(KEY,), tokens_per_minute_per_key=300)
    api = client(server, api_key=KEY)
    with pytest.raises(openai.RateLimitError) as caught:
        api.completions.create(model=MODEL, prompt="Hi", max_tokens=600, **GREEDY)
    body = caught.value.body
    assert body["code"] == "request_too_large" and body["param"] == "max_tokens"
    assert "300" in body["message"] and "retry-after" not in caught.value.response.headers
    with pytest.raises(openai.RateLimitError) as caught:
        api.completions.create(model=MODEL, prompt="Hi " * 400, max_tokens=1)
    assert caught.value.body["code"] == "request_too_large" and caught.value.body["param"] == "prompt"
    with pytest.raises(openai.RateLimitError) as caught:
        api.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_completion_tokens=400
        )
    assert caught.value.body["param"] == "max_completion_tokens"
    assert _spent(server) == 0


def test_concurrent_requests_cannot_overshoot_and_unused_tokens_are_refunded(serve):
    server = serve(api_keys=(KEY,), tokens_per_minute_per_key=300)
    api = client(server, api_key=KEY)
    first = api.completions.create(model=MODEL, prompt="Hi", max_tokens=200, stream=True, **GREEDY)
    next(iter(first))  # admitted and running: it holds 200 tokens and its prompt
    with pytest.raises(openai.RateLimitError) as caught:
        api.completions.create(model=MODEL, prompt="Hi", max_tokens=200, **GREEDY)
    assert caught.value.body["code"] == "rate_limit_exceeded"
    assert int(caught.value.response.headers["retry-after"]) >= 1
    first.close()  # ends early: what it did not generate goes back to the budget
    wait_until(lambda: server.state.admission.in_flight == 0, 30, "the first request to end")
    spent = _spent(server)
    assert 0 < spent < 100
    second = api.completions.create(model=MODEL, prompt="Hi", max_tokens=200, **GREEDY)
    assert second.usage.completion_tokens == 200
    assert _spent(server) <= 300


def test_chat_without_a_cap_gets_the_budget_left_as_its_cap(serve):
    server = serve(api_keys=(KEY,), tokens_per_minute_per_key=120)
    api = client(server, api_key=KEY)
    messages = [{"role": "user", "content": "Tell me a long story."}]
    reply = api.chat.completions.create(model=MODEL, messages=messages, **GREEDY)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.total_tokens <= 120 and reply.usage.completion_tokens > 1
    with pytest.raises(openai.RateLimitError) as caught:  # the minute is spent
        api.chat.completions.create(model=MODEL, messages=messages, **GREEDY)
    assert caught.value.body["code"] == "rate_limit_exceeded"
    assert 1 <= int(caught.value.response.headers["retry-after"]) <= 60
    assert _spent(server) <= 120
