"""Prefix caching through the official client: a prompt that starts like an earlier one to the
same adapter reports its cached start in ``usage`` (chat, completions, their streams, the
Responses API), never one another adapter computed, nor for a request that scores its prompt;
/metrics and the request log count the hits; with caching off nothing is cached."""

from __future__ import annotations

import re
import urllib.request
import uuid

import pytest

from multilora_studio.engine import Engine, EngineConfig
from multilora_studio.server import ApiServer, ServerConfig
from tests.server_fixtures import GREEDY, client
from tests.waiting import wait_until

ADAPTER, OTHER = "tiny-r8-qo", "tiny-r4-qv"
RULES = "You keep a lighthouse and answer questions about the sea in short, plain words. " * 5
STREAM_USAGE = {"stream": True, "stream_options": {"include_usage": True}}


def long_prompt() -> str:
    """A long text no earlier request began with (the suite's engine keeps its cache between tests)."""
    return f"{uuid.uuid4().hex} {RULES}"


def chat(system: str, question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def counter(server, name: str) -> float:
    """The value of the engine series ``name`` of the server's one base (replica 0)."""
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    found = re.search(rf'^{name}{{base="[^"]+",replica="0"}} (\S+)$', text, re.MULTILINE)
    assert found is not None, f"{name} is not on /metrics"
    return float(found.group(1))


def assert_cached(usage_details, prompt_tokens: int, block_size: int) -> None:
    cached = usage_details.cached_tokens
    assert 0 < cached < prompt_tokens and cached % block_size == 0, (cached, prompt_tokens)


def test_a_repeated_system_prompt_comes_from_the_cache(serve, engine):
    server = serve()
    api, block = client(server), engine.config.block_size
    system = long_prompt()
    hits_before = counter(server, "multilora_prefix_cache_hit_tokens_total")
    replies = [
        api.chat.completions.create(model=ADAPTER, messages=chat(system, question), max_tokens=3, **GREEDY)
        for question in ("Is the sea cold?", "Where do gulls sleep?")
    ]
    first, second = (reply.usage for reply in replies)
    assert first.prompt_tokens_details.cached_tokens == 0
    assert_cached(second.prompt_tokens_details, second.prompt_tokens, block)
    other = api.chat.completions.create(
        model=OTHER, messages=chat(system, "Is the sea cold?"), max_tokens=3, **GREEDY
    )
    assert other.usage.prompt_tokens_details.cached_tokens == 0  # never another adapter's KV
    scored = api.chat.completions.create(  # scoring the prompt needs every token's logits
        model=ADAPTER,
        messages=chat(system, "Is the sea cold?"),
        max_tokens=1,
        **(GREEDY | {"extra_body": {"prompt_logprobs": 1}}),
    )
    assert scored.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.prompt_tokens_details.cached_tokens
    wait_until(
        lambda: counter(server, "multilora_prefix_cache_hit_tokens_total") >= hits_before + cached,
        what="the prefix cache's hits on /metrics",
    )
    assert counter(server, "multilora_prefix_cache_queried_tokens_total") > 0
    assert counter(server, "multilora_prefix_cache_blocks") > 0
    records = {record.request_id: record for record in server.request_log.records()}
    assert records[replies[1].id].cached_tokens == cached
    assert records[replies[0].id].cached_tokens == 0


def test_completions_and_streams_report_cached_tokens(serve, engine):
    api, block = client(serve()), engine.config.block_size
    text = long_prompt()
    first = api.completions.create(model=ADAPTER, prompt=f"{text} One:", max_tokens=2, **GREEDY)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    second = api.completions.create(model=ADAPTER, prompt=f"{text} Two:", max_tokens=2, **GREEDY)
    assert_cached(second.usage.prompt_tokens_details, second.usage.prompt_tokens, block)
    chunks = list(
        api.completions.create(model=ADAPTER, prompt=f"{text} Three:", max_tokens=2, **GREEDY, **STREAM_USAGE)
    )
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens == 2
    assert_cached(usage.prompt_tokens_details, usage.prompt_tokens, block)

    system = long_prompt()
    for question, cached in (("Is the sea cold?", False), ("Where do gulls sleep?", True)):
        chunks = list(
            api.chat.completions.create(
                model=ADAPTER, messages=chat(system, question), max_tokens=2, **GREEDY, **STREAM_USAGE
            )
        )
        usage = chunks[-1].usage
        if cached:
            assert_cached(usage.prompt_tokens_details, usage.prompt_tokens, block)
        else:
            assert usage.prompt_tokens_details.cached_tokens == 0


def test_responses_report_cached_input_tokens(serve, engine):
    api, instructions = client(serve()), long_prompt()
    first, second = (
        api.responses.create(
            model=ADAPTER, input=question, instructions=instructions, max_output_tokens=2, **GREEDY
        ).usage
        for question in ("Is the sea cold?", "Where do gulls sleep?")
    )
    assert first.input_tokens_details.cached_tokens == 0
    assert_cached(second.input_tokens_details, second.input_tokens, engine.config.block_size)


@pytest.fixture
def uncached_server(tiny_model_dir, server_adapters):
    """A server on an engine with prefix caching off."""
    config = EngineConfig(
        model=str(tiny_model_dir),
        device="cpu",
        dtype="float32",
        max_lora_rank=32,
        max_model_len=256,
        enable_prefix_caching=False,
    )
    with Engine(config) as engine:
        engine.add_adapter(ADAPTER, server_adapters[ADAPTER])
        with ApiServer(engine, ServerConfig(port=0)) as server:
            yield server


def test_nothing_is_cached_with_prefix_caching_off(uncached_server):
    api, system = client(uncached_server), long_prompt()
    for question in ("Is the sea cold?", "Where do gulls sleep?"):
        usage = api.chat.completions.create(
            model=ADAPTER, messages=chat(system, question), max_tokens=2, **GREEDY
        ).usage
        assert usage.prompt_tokens > 0 and usage.prompt_tokens_details.cached_tokens == 0
    response = api.responses.create(
        model=ADAPTER, input="Hi", instructions=system, max_output_tokens=2, **GREEDY
    )
    assert response.usage.input_tokens_details.cached_tokens == 0
    assert counter(uncached_server, "multilora_prefix_cache_hit_tokens_total") == 0
    assert counter(uncached_server, "multilora_prefix_cache_blocks") == 0


def test_a_cache_salt_shares_cached_prefixes_only_with_the_same_salt(serve):
    api = client(serve())
    system = long_prompt()

    def cached(question: str, salt: str | None) -> int:
        extra = {} if salt is None else {"extra_body": {"cache_salt": salt}}
        reply = api.chat.completions.create(
            model=ADAPTER, messages=chat(system, question), max_tokens=2, **(GREEDY | extra)
        )
        return reply.usage.prompt_tokens_details.cached_tokens

    assert cached("Is the sea cold?", "tenant-a") == 0
    assert cached("Where do gulls sleep?", "tenant-b") == 0  # another salt: nothing shared
    assert cached("Where do gulls sleep?", None) == 0  # no salt is a salt of its own
    assert cached("What is a tide?", "tenant-a") > 0
