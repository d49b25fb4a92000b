"""Hub adapters on demand: a real server on loopback pulls ``org/name[@rev]`` from the test Hub (olah)."""

from __future__ import annotations

import functools
import sqlite3
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from multilora_studio.adapters.hub import repo_cache_dir
from multilora_studio.server import ApiServer
from tests.adapter_fixtures import BASE_REPO, HUB_ORG
from tests.adapters.hub_server import free_port

LORA = f"{HUB_ORG}/tiny-lora"  # v1 (tag): rank 4 on q,v; main: rank 8 on attention


@pytest.fixture
def serve(serve, engine, registry, hub_env):
    """The shared server fixture with Hub pulls going into ``registry``; the adapters a test
    pulled are unloaded from the shared engine afterwards."""
    before = {info.name for info in engine.list_adapters()}
    yield functools.partial(serve, registry=registry)
    for info in engine.list_adapters():
        if info.name not in before:
            engine.remove_adapter(info.name)


def client(server: ApiServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def chat(server: ApiServer, model: str) -> str:
    reply = client(server).chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3, temperature=0
    )
    assert reply.model == model
    return reply.choices[0].message.content or ""


def library_rows(registry) -> list[tuple[str, str, str]]:
    """(name, source, revision) of each Hub adapter, read from the library's SQLite file itself."""
    with sqlite3.connect(registry.db_path) as conn:
        return conn.execute(
            "SELECT name, source, revision FROM adapters WHERE source_kind = 'hub' ORDER BY name"
        ).fetchall()


def test_a_hub_adapter_is_pulled_registered_and_served(hub, serve, registry, engine):
    server = serve(allow_hub_adapters=True)
    assert LORA not in {info.name for info in engine.list_adapters()}
    chat(server, LORA)
    completion = client(server).completions.create(model=LORA, prompt="hello", max_tokens=3, temperature=0)
    assert completion.model == LORA
    assert library_rows(registry) == [(LORA, LORA, hub.repos.shas[(LORA, "v2")])]
    assert LORA in {info.name for info in engine.list_adapters()}
    assert server.state.hub is not None and server.state.hub.pulls_started == 1


def test_a_revision_pins_the_commit(hub, serve, registry):
    server = serve(allow_hub_adapters=True)
    model = f"{LORA}@v1"
    chat(server, model)
    assert library_rows(registry) == [(model, LORA, hub.repos.shas[(LORA, "v1")])]


def test_concurrent_requests_for_one_new_adapter_share_one_pull(hub, serve, registry):
    server = serve(allow_hub_adapters=True)
    model = f"{HUB_ORG}/tiny-r8-all"
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: chat(server, model), range(4)))
    assert len(answers) == 4
    assert server.state.hub is not None and server.state.hub.pulls_started == 1
    assert library_rows(registry) == [(model, model, hub.repos.shas[(model, "v1")])]


def test_a_missing_repository_is_a_404_naming_model_and_is_retried_later(hub, serve, registry, tiny_adapters):
    server = serve(allow_hub_adapters=True)
    model = f"{HUB_ORG}/late-lora"
    with pytest.raises(openai.NotFoundError) as caught:
        chat(server, model)
    assert caught.value.body["param"] == "model" and model in caught.value.body["message"]
    assert library_rows(registry) == []

    hub.repos.add_adapter(model, "v1", tiny_adapters["tiny-r4-qv"], BASE_REPO)
    chat(server, model)
    assert server.state.hub is not None and server.state.hub.pulls_started == 2
    assert [row[0] for row in library_rows(registry)] == [model]


@pytest.mark.parametrize("repo", [BASE_REPO, f"{HUB_ORG}/tiny-saved-head", f"{HUB_ORG}/tiny-pickle"])
def test_a_repository_that_is_not_a_servable_adapter_is_a_400_naming_model(hub, serve, registry, repo):
    server = serve(allow_hub_adapters=True)
    with pytest.raises(openai.BadRequestError) as caught:
        chat(server, repo)
    assert caught.value.body["param"] == "model" and repo in caught.value.body["message"]
    assert library_rows(registry) == []


def test_without_the_flag_an_unknown_model_is_a_404_and_nothing_is_pulled(hub, serve, registry, hub_env):
    server = serve()
    model = f"{LORA}@v2"
    with pytest.raises(openai.NotFoundError) as caught:
        chat(server, model)
    assert caught.value.body["param"] == "model"
    assert server.state.hub is None
    assert library_rows(registry) == []
    assert not repo_cache_dir(LORA, hub_env.cache_dir).exists()


def test_an_unreachable_hub_is_a_502_naming_model(serve, registry, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    server = serve(allow_hub_adapters=True)
    model = f"{LORA}@v1-unreached"  # served by no other test
    with pytest.raises(openai.InternalServerError) as caught:
        chat(server, model)
    assert caught.value.status_code == 502
    assert caught.value.body["param"] == "model" and model in caught.value.body["message"]
    assert library_rows(registry) == []
