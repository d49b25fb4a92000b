"""Through HTTP and the openai client, in a mixed batch of adapters and the base, every returned
log-probability equals log_softmax of PEFT's logits for that adapter alone (float32, within 1e-4),
and the top-k come in PEFT's order (ties aside)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from tests.engine.reference import PeftReference
from tests.server_fixtures import client

TOLERANCE = 1e-4
TOP = 5
NEW_TOKENS = 4
PROMPTS = [
    "Once upon a time",
    "The quick brown fox jumps over the lazy dog and then",
    "def fibonacci(n):",
    "A short poem about the sea: the waves roll in, the gulls cry, and the sand",
]
ADAPTERS = ["tiny-r4-qv", "tiny-r8-all", "tiny-r32-ko-down", "tiny-r16-vup", None]
# Sampled (not greedy), so chosen tokens are not always the most likely; the scores are of the
# raw logits all the same. Token ids come back as "token_id:<id>" (vLLM's extension).
SETTINGS = {"max_tokens": NEW_TOKENS, "temperature": 1.5, "seed": 7}
EXTRA = {"ignore_eos": True, "prompt_logprobs": TOP, "return_tokens_as_token_ids": True}


@pytest.fixture(scope="module")
def reference(tiny_model_dir, server_adapters) -> PeftReference:
    return PeftReference(tiny_model_dir, {name: server_adapters[name] for name in ADAPTERS if name})


def reference_logprobs(reference: PeftReference, adapter: str | None, ids: list[int]) -> torch.Tensor:
    """[len(ids), V]: log_softmax of PEFT's logits at every position, for ``adapter`` alone."""
    model = reference.model
    with torch.no_grad():
        if adapter is None:
            with model.disable_adapter():
                logits = model(input_ids=torch.tensor([ids])).logits[0]
        else:
            model.set_adapter(adapter)
            logits = model(input_ids=torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


def token_id(name: str) -> int:
    assert name.startswith("token_id:"), name
    return int(name.removeprefix("token_id:"))


def check(row: torch.Tensor, token: int, value: float, top: list[tuple[int, float]]) -> None:
    """One position: the token's log-probability and the top-k, against PEFT's row [V]."""
    assert abs(value - float(row[token])) < TOLERANCE, (token, value, float(row[token]))
    best = row.topk(len(top))
    for (other, logprob), expected, expected_id in zip(
        top, best.values.tolist(), best.indices.tolist(), strict=True
    ):
        assert abs(logprob - expected) < TOLERANCE
        assert other == expected_id or abs(float(row[other]) - expected) < TOLERANCE  # a tie may swap


def answer(api, model: str, prompt: str, chat: bool):
    if chat:
        messages = [{"role": "user", "content": prompt}]
        return api.chat.completions.create(
            model=model, messages=messages, logprobs=True, top_logprobs=TOP, extra_body=EXTRA, **SETTINGS
        )
    return api.completions.create(
        model=model, prompt=prompt, logprobs=TOP, echo=True, extra_body=EXTRA, **SETTINGS
    )


def scored_positions(choice, chat: bool, prompt_len: int):
    """(token id, logprob, [(top id, logprob)]) for every generated token, from either shape."""
    if chat:
        return [
            (token_id(item.token), item.logprob, [(token_id(t.token), t.logprob) for t in item.top_logprobs])
            for item in choice.logprobs.content
        ]
    legacy = choice.logprobs
    assert len(legacy.tokens) == prompt_len + NEW_TOKENS and legacy.token_logprobs[0] is None
    found = []
    for name, value, top in zip(legacy.tokens, legacy.token_logprobs, legacy.top_logprobs, strict=True):
        if value is not None:
            found.append((token_id(name), value, [(token_id(t), lp) for t, lp in list(top.items())[:TOP]]))
    return found


def test_http_logprobs_equal_peft_for_each_adapter_in_a_mixed_batch(serve, engine, reference):
    api = client(serve())
    jobs = [(adapter, PROMPTS[i % len(PROMPTS)], i % 3 == 2) for i, adapter in enumerate(ADAPTERS * 2)]
    barrier = threading.Barrier(len(jobs))  # every request at once: batches of several adapters

    def ask(job):
        adapter, prompt, chat = job
        barrier.wait()
        return answer(api, adapter or engine.model_name, prompt, chat)

    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(ask, jobs))
    checked = 0
    for (adapter, prompt, chat), response in zip(jobs, answers, strict=True):
        choice = response.choices[0]
        prompt_ids = engine.encode([{"role": "user", "content": prompt}] if chat else prompt)
        positions = scored_positions(choice, chat, len(prompt_ids))
        if not chat:  # the echo scored the prompt (entry 0 has no context), then the completion
            assert [p[0] for p in positions[: len(prompt_ids) - 1]] == prompt_ids[1:]
            positions = positions[len(prompt_ids) - 1 :]
        generated = [p[0] for p in positions]
        assert len(generated) == NEW_TOKENS
        rows = reference_logprobs(reference, adapter, prompt_ids + generated)  # [L + n, V]
        scores = choice.model_extra["prompt_logprobs"]
        assert len(scores) == len(prompt_ids) and scores[0] is None
        for position in range(1, len(prompt_ids)):
            entry = scores[position]
            own = entry[str(prompt_ids[position])]
            ranked = sorted((v["rank"], int(k), v["logprob"]) for k, v in entry.items() if v["rank"] <= TOP)
            check(rows[position - 1], prompt_ids[position], own["logprob"], [(t, lp) for _, t, lp in ranked])
            checked += 1
        for i, (token, value, top) in enumerate(positions):
            check(rows[len(prompt_ids) + i - 1], token, value, top)
            checked += 1
    assert checked > 150
