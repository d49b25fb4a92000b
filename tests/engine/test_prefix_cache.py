"""The prefix cache on the real engine (tiny model): a warm cache gives what a cold engine gives,
per adapter, in mixed batches; KV is reused only under the same base, adapter weights and strength."""

from __future__ import annotations

import uuid

import pytest
import torch

from multilora_studio.engine import SamplingParams
from multilora_studio.engine.step.device_setup import kv_bytes_per_block

SYSTEM = (
    "You are a careful assistant for a lighthouse keeper. Answer in short sentences, name the "
    "weather, the tide and the lamp, and never invent a ship that was not seen from the tower. "
)
QUESTIONS = ["What did you see tonight?", "Is the lamp lit?", "How high is the tide?", "Any ships?"]
WARM_ADAPTERS = ["tiny-r8-all", "tiny-r4-qv", None]
MIXED_ADAPTERS = ["tiny-r8-all", "tiny-r4-qv", None, "tiny-r16-mlp"]  # the last one runs cold
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=3)


def observed(outputs) -> list[tuple[list[int], list[int], list[float]]]:
    """Tokens, and each step's alternatives and log-probabilities."""
    found = []
    for out in outputs:
        tops = [pair for step in out.logprobs for pair in step.top]
        found.append((out.token_ids, [token for token, _ in tops], [value for _, value in tops]))
    return found


def assert_same(warm, cold, exact: bool) -> None:
    for (tokens, top, values), (cold_tokens, cold_top, cold_values) in zip(warm, cold, strict=True):
        assert tokens == cold_tokens
        assert top == cold_top
        if exact:
            assert values == cold_values
        else:
            assert values == pytest.approx(cold_values, abs=2e-4)


@pytest.mark.parametrize("batch_invariant", [False, True])
def test_warm_cache_gives_what_a_cold_engine_gives_per_adapter_in_a_mixed_batch(make_engine, batch_invariant):
    warm = make_engine(batch_invariant=batch_invariant)
    cold = make_engine(batch_invariant=batch_invariant, enable_prefix_caching=False)
    warm.generate([SYSTEM + QUESTIONS[0]] * 3, WARM_ADAPTERS, GREEDY)  # fills the cache
    prompts = [SYSTEM + q for q in QUESTIONS]
    hit = warm.generate(prompts, MIXED_ADAPTERS, GREEDY)
    assert [out.num_cached_tokens > 0 for out in hit] == [True, True, True, False]
    shared = len(warm.tokenizer(SYSTEM).input_ids)
    assert all(out.num_cached_tokens <= shared for out in hit)
    assert all(out.num_cached_tokens % warm.config.block_size == 0 for out in hit)
    reference = cold.generate(prompts, MIXED_ADAPTERS, GREEDY)
    assert [out.num_cached_tokens for out in reference] == [0, 0, 0, 0]
    assert_same(observed(hit), observed(reference), exact=batch_invariant)
    metrics = warm.metrics(fresh=True)
    assert metrics.prefix_cache_hit_tokens == sum(out.num_cached_tokens for out in hit)
    assert metrics.prefix_cache_queried_tokens >= sum(len(out.prompt_token_ids) for out in hit)
    assert metrics.prefix_cache_blocks > 0 and cold.metrics(fresh=True).prefix_cache_blocks is None


def test_a_prompt_inside_a_cached_prefix_still_computes_its_last_token(make_engine):
    engine = make_engine(adapters=["tiny-r8-all"])
    long_prompt = SYSTEM + QUESTIONS[0]
    engine.generate([long_prompt], ["tiny-r8-all"], GREEDY)
    ids = engine.tokenizer(long_prompt).input_ids
    block = engine.config.block_size
    exact = ids[: 3 * block]  # ends on a block boundary: the last block is computed again
    (out,) = engine.generate([exact], ["tiny-r8-all"], GREEDY)
    assert out.num_cached_tokens == 2 * block
    cold = make_engine(adapters=["tiny-r8-all"], enable_prefix_caching=False)
    assert_same(observed([out]), observed(cold.generate([exact], ["tiny-r8-all"], GREEDY)), exact=False)


def test_no_block_is_shared_across_adapters_strengths_or_the_base(make_engine):
    engine = make_engine()
    prompt = SYSTEM + QUESTIONS[1]
    engine.generate([prompt], ["tiny-r8-all"], GREEDY)
    for adapter, scale in [("tiny-r4-qv", 1.0), (None, 1.0), ("tiny-r8-all", 0.5)]:
        params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, adapter_scale=scale)
        (out,) = engine.generate([prompt], [adapter], params)
        assert out.num_cached_tokens == 0, (adapter, scale)
    (again,) = engine.generate([prompt], ["tiny-r8-all"], GREEDY)
    assert again.num_cached_tokens > 0


def test_an_adapter_added_again_under_its_name_never_gets_the_old_weights_kv(make_engine, tiny_adapters):
    engine = make_engine(adapters=[])
    cold = make_engine(adapters=[], enable_prefix_caching=False)
    prompt = SYSTEM + QUESTIONS[2]
    engine.add_adapter("chat", tiny_adapters["tiny-r8-all"])
    engine.generate([prompt], ["chat"], GREEDY)
    blocks = engine.metrics(fresh=True).prefix_cache_blocks
    engine.remove_adapter("chat")
    assert engine.metrics(fresh=True).prefix_cache_blocks < blocks  # its blocks are dropped with it
    engine.add_adapter("chat", tiny_adapters["tiny-r16-mlp"])  # new weights, same name
    (out,) = engine.generate([prompt], ["chat"], GREEDY)
    assert out.num_cached_tokens == 0
    cold.add_adapter("chat", tiny_adapters["tiny-r16-mlp"])
    assert_same(observed([out]), observed(cold.generate([prompt], ["chat"], GREEDY)), exact=False)


def test_a_small_pool_evicts_and_preempts_and_outputs_stay_those_of_a_cold_engine(make_engine, tiny_engine):
    tiny_spec = tiny_engine.spec
    pool = 24  # blocks: a few requests' worth, so the cache evicts and running requests are preempted
    gb = pool * kv_bytes_per_block(tiny_spec, 16, torch.float32) / 2**30
    warm = make_engine(kv_cache_memory_gb=gb, max_num_seqs=8)
    cold = make_engine(kv_cache_memory_gb=gb, max_num_seqs=8, enable_prefix_caching=False)
    params = SamplingParams(max_tokens=70, temperature=0, ignore_eos=True)  # ~8 blocks a request
    adapters = ["tiny-r8-all", None, "tiny-r4-qv", "tiny-r8-all"]
    rounds = [[f"{SYSTEM}{q} Round {r}." for q in QUESTIONS] for r in range(3)]
    for prompts in rounds:
        got = [out.token_ids for out in warm.generate(prompts, adapters, params)]
        want = [out.token_ids for out in cold.generate(prompts, adapters, params)]
        assert got == want
    metrics = warm.metrics(fresh=True)
    assert metrics.kv_blocks_total == pool
    assert metrics.prefix_cache_hit_tokens > 0
    assert metrics.preemptions > 0 and cold.metrics(fresh=True).preemptions > 0
    assert metrics.prefix_cache_blocks <= pool


def test_prompt_logprobs_bypass_the_cache_unless_they_start_after_the_prefix(make_engine):
    engine = make_engine(adapters=["tiny-r8-all"])
    cold = make_engine(adapters=["tiny-r8-all"], enable_prefix_caching=False)
    context = SYSTEM + QUESTIONS[3]
    engine.generate([context], ["tiny-r8-all"], GREEDY)
    context_ids = engine.tokenizer(context).input_ids
    ids = context_ids + engine.tokenizer(" No ships tonight.", add_special_tokens=False).input_ids
    whole = SamplingParams(max_tokens=0, prompt_logprobs=2)
    (scored,) = engine.generate([ids], ["tiny-r8-all"], whole)
    assert scored.num_cached_tokens == 0
    tail = SamplingParams(max_tokens=0, prompt_logprobs=2, prompt_logprobs_start=len(context_ids))
    (continuation,) = engine.generate([ids], ["tiny-r8-all"], tail)
    assert continuation.num_cached_tokens > 0
    (reference,) = cold.generate([ids], ["tiny-r8-all"], whole)
    entries = list(continuation.prompt_logprobs)
    assert len(entries) == len(ids)
    assert entries[: len(context_ids)] == [None] * len(context_ids)
    start = len(context_ids)
    for got, want in zip(entries[start:], list(reference.prompt_logprobs)[start:], strict=True):
        assert got.token_id == want.token_id and got.rank == want.rank
        assert got.logprob == pytest.approx(want.logprob, abs=2e-4)
        assert [t for t, _ in got.top] == [t for t, _ in want.top]
    for got, want in zip(list(scored.prompt_logprobs)[1:], list(reference.prompt_logprobs)[1:], strict=True):
        assert got.logprob == pytest.approx(want.logprob, abs=2e-4)


def test_requests_with_different_cache_salts_share_no_blocks(tiny_engine):
    prompt = f"{uuid.uuid4().hex} {SYSTEM}"  # no earlier test sent it to the suite's engine

    def cached(salt: str | None) -> int:
        params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True, cache_salt=salt)
        (out,) = tiny_engine.generate([prompt], ["tiny-r8-all"], params)
        return out.num_cached_tokens

    assert cached("a") == 0
    assert cached("b") == 0 and cached(None) == 0  # another salt, or none, shares nothing
    assert cached("a") > 0 and cached(None) > 0
    with pytest.raises(ValueError, match="cache_salt"):
        SamplingParams(cache_salt="x" * 257)
