"""Server fixtures for every suite that needs one: a real engine on the tiny model with eight adapters,
and real servers on random loopback ports (registered as a plugin by tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from multilora_studio.engine import Engine, EngineConfig
from multilora_studio.server import ApiServer, ServerConfig
from tests.fixtures import AdapterSpec, build_adapter

EXTRA_ADAPTERS = (
    AdapterSpec("tiny-r4-down", 4, 8, ("down_proj",), 21),
    AdapterSpec("tiny-r8-qo", 8, 16, ("q_proj", "o_proj"), 22),
    AdapterSpec("tiny-r16-vup", 16, 32, ("v_proj", "up_proj"), 23),
)
GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="session")
def server_adapters(tmp_path_factory, tiny_model_dir, tiny_adapters) -> dict[str, Path]:
    """The five fixture adapters plus three more: eight distinct adapters."""
    root = tmp_path_factory.mktemp("server-adapters")
    extra = {spec.name: build_adapter(tiny_model_dir, spec, root / spec.name) for spec in EXTRA_ADAPTERS}
    return {**tiny_adapters, **extra}


@pytest.fixture(scope="session")
def engine(tiny_model_dir, server_adapters, engine_device):
    """One engine for the whole server suite; tests that change its adapters put them back."""
    config = EngineConfig(
        model=str(tiny_model_dir),
        device=engine_device,
        dtype="float32",
        max_loras=8,
        max_lora_rank=32,
        max_num_seqs=64,
        max_model_len=1024,
        max_num_batched_tokens=1024,
    )
    with Engine(config) as built:
        for name, path in server_adapters.items():
            built.add_adapter(name, path)
        yield built


@pytest.fixture
def serve(engine):
    """Start an ApiServer on a free loopback port with these ServerConfig fields (and the library
    ``registry`` for Hub pulls); stopped after the test."""
    servers: list[ApiServer] = []

    def start(registry=None, **settings) -> ApiServer:
        server = ApiServer(engine, ServerConfig(port=0, **settings), registry=registry)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def client(server: ApiServer, api_key: str = "unused", **options) -> openai.OpenAI:
    """The official client pointed at ``server``; no retries, so limits show as errors."""
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=api_key, max_retries=0, timeout=60, **options)
