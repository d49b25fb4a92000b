"""Hub pulls from requests (``--allow-hub-adapters``) against the test Hub (olah): admin keys only,
bounded at once, in total and in bytes, on threads of their own while the Hub is slow; runtime
adapter loads on threads of their own while the disk is slow."""

from __future__ import annotations

import functools
import os
import threading
import time
from urllib.parse import urlsplit

import openai
import pytest

from multilora_studio.adapters.hub import repo_cache_dir
from multilora_studio.server import routes_admin
from multilora_studio.server.api_keys import USER, ApiKey
from tests.adapter_fixtures import HUB_ORG
from tests.security.slow_relay import SlowRelay
from tests.server.raw_http import post_json
from tests.server_fixtures import GREEDY, client
from tests.threads import CheckedThread

LORA = f"{HUB_ORG}/tiny-lora"
ADMIN_KEY = "sk-admin-key-00001"
USER_KEY = ApiKey("sk-user-key-000001", USER, name="user")
SHARED_POOL = min(32, (os.cpu_count() or 1) + 4)  # the event loop's default thread pool
HOLD_S = 6.0  # each connection to the slow Hub waits this long (under the client's timeouts)


@pytest.fixture
def serve(serve, engine, registry, hub_env):
    """The shared server fixture pulling into ``registry``; pulled adapters are unloaded afterwards."""
    before = {info.name for info in engine.list_adapters()}
    yield functools.partial(serve, registry=registry, allow_hub_adapters=True)
    for info in engine.list_adapters():
        if info.name not in before:
            engine.remove_adapter(info.name)


def chat(server, model: str, key: str = "unused") -> str:
    reply = client(server, api_key=key).chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2, temperature=0
    )
    return reply.model


def refusal(server, model: str, key: str = "unused") -> dict:
    with pytest.raises(openai.APIStatusError) as refused:
        chat(server, model, key)
    return {"status": refused.value.status_code, **refused.value.body}


def hub_rows(registry) -> list[str]:
    return [record.name for record in registry.list_adapters() if record.source_kind == "hub"]


def test_only_admin_keys_pull(serve, registry, hub_env):
    server = serve(api_keys=(ADMIN_KEY, USER_KEY))
    refused = refusal(server, LORA, USER_KEY.secret)
    assert (refused["status"], refused["code"], refused["param"]) == (404, "model_not_found", "model")
    assert server.state.hub is not None and server.state.hub.pulls_started == 0
    assert hub_rows(registry) == [] and not repo_cache_dir(LORA, hub_env.cache_dir).exists()
    assert chat(server, LORA, ADMIN_KEY) == LORA
    assert chat(server, LORA, USER_KEY.secret) == LORA  # once an admin pulled it, it is served


def test_pulls_are_capped_in_total(serve, registry):
    server = serve(hub_pull_limit=1)
    assert chat(server, LORA) == LORA
    refused = refusal(server, f"{HUB_ORG}/tiny-r8-all")
    assert (refused["status"], refused["code"], refused["param"]) == (403, "hub_pull_limit", "model")
    assert hub_rows(registry) == [LORA]


def test_an_adapter_over_the_byte_cap_is_refused_before_its_files_are_fetched(serve, registry, hub_env):
    server = serve(hub_pull_max_bytes=4096)
    refused = refusal(server, LORA)
    assert (refused["status"], refused["code"], refused["param"]) == (413, "hub_pull_too_large", "model")
    assert "this pull takes at most 4096" in refused["message"]
    assert hub_rows(registry) == [] and not repo_cache_dir(LORA, hub_env.cache_dir).exists()


def test_slow_pulls_neither_starve_other_requests_nor_run_past_their_cap(serve, engine, hub, monkeypatch):
    relay = SlowRelay(urlsplit(hub.endpoint).port, HOLD_S)
    monkeypatch.setenv("HF_ENDPOINT", relay.endpoint)
    try:
        server = serve()
        outcomes: dict[str, dict] = {}

        def ask(model: str) -> None:
            outcomes[model] = refusal(server, model)

        pulls = [CheckedThread(ask, f"{HUB_ORG}/missing-{n}") for n in range(SHARED_POOL + 2)]
        for thread in pulls:
            thread.start()
        time.sleep(1.0)  # every pull has started (or been refused)
        started = time.monotonic()
        made = client(server).completions.create(model=engine.model_name, prompt="Hi", max_tokens=2, **GREEDY)
        took = time.monotonic() - started
        for thread in pulls:
            thread.join(120)
    finally:
        relay.close()
    assert made.usage.completion_tokens == 2
    assert took < 2.0, f"a base completion took {took:.2f} s while Hub pulls were stalled"
    statuses = sorted(outcome["status"] for outcome in outcomes.values())
    assert statuses.count(429) == len(pulls) - 2  # two pulls run, the others are refused at once
    assert {o["code"] for o in outcomes.values() if o["status"] == 429} == {"hub_pulls_busy"}
    assert server.state.hub is not None and server.state.hub.pulls_started == 2


def test_slow_adapter_loads_do_not_starve_other_requests(serve, engine, monkeypatch):
    """``/v1/load_lora_adapter`` calls whose folder check hangs (a stalled network file system),
    more of them than the event loop's shared pool has threads: a base completion still runs
    at once, because runtime loads run on threads of their own."""
    released = threading.Event()
    waiting: list[str] = []

    def hung(path: str) -> bool:
        waiting.append(path)
        released.wait(HOLD_S)  # bounded: without threads of their own, the completion waits this long
        return False

    monkeypatch.setattr(routes_admin, "_has_adapter_config", hung)
    server = serve()
    asks = [{"lora_name": f"stalled-{n}", "lora_path": f"/stalled/{n}"} for n in range(SHARED_POOL + 2)]
    loads = [CheckedThread(post_json, server.url, "/v1/load_lora_adapter", ask) for ask in asks]
    try:
        for thread in loads:
            thread.start()
        deadline = time.monotonic() + 10
        while len(waiting) < 2 and time.monotonic() < deadline:  # the loads' threads are held
            time.sleep(0.05)
        started = time.monotonic()
        made = client(server).completions.create(model=engine.model_name, prompt="Hi", max_tokens=2, **GREEDY)
        took = time.monotonic() - started
    finally:
        released.set()
        for thread in loads:
            thread.join(120)
    assert len(waiting) >= 2 and made.usage.completion_tokens == 2
    assert took < 2.0, f"a base completion took {took:.2f} s while adapter loads were stalled"
