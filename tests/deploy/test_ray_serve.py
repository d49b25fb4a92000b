"""The Ray Serve application on a local Ray (two CPUs), deployed as ``serve --ray`` does it (its
flags; three adapters from ``--lora-modules``, one from the library): two engine replicas of the
tiny model behind the ingress, driven by the official ``openai`` client: outputs equal one engine's;
Ray's multiplexed routing keeps each adapter on one replica (each read from disk once); an API
key is enforced at the ingress; its usage bills the replicas' engine seconds and counts their
cold starts; stopping it leaves no Serve process running."""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import psutil
import pytest
import ray
from ray import serve

from multilora_studio.adapters.registry import Registry
from multilora_studio.cli import build_parser
from multilora_studio.cli.serve_ray import ray_serve_options, start_on_ray, stop_on_ray
from multilora_studio.cli.shared import describe_base
from multilora_studio.engine import Engine, EngineConfig, SamplingParams
from multilora_studio.ray_app.deployments import APP_NAME, ENGINE_DEPLOYMENT
from multilora_studio.server import ServerConfig
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

ADAPTERS = ("tiny-r4-qv", "tiny-r8-all", "tiny-r16-mlp", "tiny-r8-attn")
PROMPTS = [[1, 510, 2300, 44, 901], [1, 40000, 12, 7]]
NEW_TOKENS = 8
KEY = "sk-ray-test"


def config(tiny_model_dir) -> EngineConfig:
    return EngineConfig(
        model=str(tiny_model_dir),
        device="cpu",
        dtype="float32",
        max_model_len=128,
        max_lora_rank=16,
        max_loras=4,
        max_cpu_loras=8,
        cpu_threads=1,
    )


def serve_processes() -> list[psutil.Process]:
    """Processes of this machine running a Serve controller, proxy or replica."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        command = " ".join(process.info["cmdline"] or [])
        if any(part in command for part in ("ServeReplica", "ServeController", "ProxyActor")):
            found.append(process)
    return found


@pytest.fixture(scope="module")
def expected_texts(tiny_model_dir, tiny_adapters) -> dict[tuple[int, str | None], str]:
    """(prompt index, adapter) -> one local engine's greedy text."""
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    with Engine(config(tiny_model_dir)) as engine:
        for name in ADAPTERS:
            engine.add_adapter(name, tiny_adapters[name])
        keys = [(i, a) for a in (*ADAPTERS, None) for i in range(len(PROMPTS))]
        outputs = engine.generate([PROMPTS[i] for i, _ in keys], [a for _, a in keys], params)
    return {key: output.text for key, output in zip(keys, outputs, strict=True)}


@pytest.fixture(scope="module")
def library_home(tmp_path_factory, tiny_model_dir, tiny_adapters):
    """A library of its own holding the last adapter (served from there, not --lora-modules)."""
    previous = os.environ["MULTILORA_STUDIO_HOME"]
    os.environ["MULTILORA_STUDIO_HOME"] = str(tmp_path_factory.mktemp("ray-home"))
    try:
        Registry().import_folder(tiny_adapters[ADAPTERS[-1]], describe_base(str(tiny_model_dir)))
        yield
    finally:
        os.environ["MULTILORA_STUDIO_HOME"] = previous


@pytest.fixture(scope="module")
def ray_app(tiny_model_dir, tiny_adapters, library_home):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    engine = config(tiny_model_dir)
    flags = ["serve", "--ray", "--replicas", "2", "--model", str(tiny_model_dir), "--device", "cpu"]
    flags += ["--dtype", "float32", "--max-model-len", str(engine.max_model_len), "--max-lora-rank", "16"]
    flags += ["--max-loras", "4", "--max-cpu-loras", "8", "--cpu-threads", "1", "--lora-modules"]
    flags += [f"{name}={tiny_adapters[name]}" for name in ADAPTERS[:-1]]
    options = ray_serve_options(
        build_parser().parse_args(flags), ServerConfig(host="127.0.0.1", port=port, api_keys=(KEY,))
    )
    assert options.engine == engine and options.replicas == 2 and set(options.adapters) == set(ADAPTERS)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield start_on_ray(options, address=None)
    finally:
        stop_on_ray()


def routers_know(handle) -> bool:
    """Whether a call routed by each adapter's multiplexed id lands on a replica holding it
    (the replicas report what they hold to the controller, which tells the routers)."""
    for name in ADAPTERS:
        held = handle.options(multiplexed_model_id=name).holdings.remote().result()
        if name not in held["host_tier"]:
            return False
    return True


def replica_holdings(handle) -> dict[str, dict]:
    """Each replica's ``holdings()`` by replica id (Ray routes each call to one of them)."""
    holdings: dict[str, dict] = {}
    deadline = time.monotonic() + 60
    while len(holdings) < 2 and time.monotonic() < deadline:
        held = handle.holdings.remote().result()
        holdings[held["replica"]] = held
    assert len(holdings) == 2, "both replicas answer"
    return holdings


def complete(client: openai.OpenAI, index: int, adapter: str | None, base: str) -> str:
    reply = client.completions.create(
        model=adapter or base,
        prompt=PROMPTS[index],
        max_tokens=NEW_TOKENS,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    return reply.choices[0].text


def test_two_ray_replicas_answer_like_one_engine_and_keep_each_adapter_on_one(ray_app, expected_texts):
    client = openai.OpenAI(base_url=f"{ray_app}/v1", api_key=KEY, max_retries=0)
    models = {m.id for m in client.models.list().data}
    assert set(ADAPTERS) <= models
    base = next(m for m in models if m not in ADAPTERS)
    for adapter in ADAPTERS:  # one request each: every adapter is loaded on one replica
        assert complete(client, 0, adapter, base) == expected_texts[(0, adapter)]
    handle = serve.get_deployment_handle(ENGINE_DEPLOYMENT, APP_NAME)
    wait_until(lambda: routers_know(handle), 60, "Ray's routers to learn which replica holds each adapter")
    keys = list(expected_texts) * 3
    with ThreadPoolExecutor(6) as pool:
        texts = list(pool.map(lambda key: complete(client, key[0], key[1], base), keys))
    assert texts == [expected_texts[key] for key in keys]

    holdings = replica_holdings(handle)
    tiers = [set(h["host_tier"]) for h in holdings.values()]
    assert sum(h["disk_loads"] for h in holdings.values()) == len(ADAPTERS), holdings
    assert not tiers[0] & tiers[1] and tiers[0] | tiers[1] == set(ADAPTERS)

    with pytest.raises(openai.AuthenticationError):  # the ingress enforces the keys
        openai.OpenAI(base_url=f"{ray_app}/v1", api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.NotFoundError):
        complete(client, 0, "not-served", "not-served")


def test_usage_behind_ray_bills_the_replicas_engine_time_and_cold_starts(ray_app):
    client = openai.OpenAI(base_url=f"{ray_app}/v1", api_key=KEY, max_retries=0)
    base = next(m.id for m in client.models.list().data if m.id not in ADAPTERS)
    for adapter in (*ADAPTERS, None):  # one at a time: an adapter's first request alone reads it
        complete(client, 1, adapter, base)
    request = urllib.request.Request(f"{ray_app}/v1/usage", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        rows = json.loads(reply.read())["data"]
    holdings = replica_holdings(serve.get_deployment_handle(ENGINE_DEPLOYMENT, APP_NAME))
    # every request of the application went through this ingress: its rows bill what the
    # replicas' engines were busy, and count a cold start for each read from disk
    billed = sum(row["engine_seconds"] for row in rows)
    assert billed == pytest.approx(sum(h["busy_seconds"] for h in holdings.values()), rel=0.01)
    answered = {row["model"]: row for row in rows if row["requests"] > row["errors"]}
    assert set(answered) == {*ADAPTERS, base} and all(row["engine_seconds"] > 0 for row in answered.values())
    assert sum(row["cold_requests"] for row in rows) == sum(h["disk_loads"] for h in holdings.values())
    cold = [row for row in rows if row["cold_requests"]]
    assert {row["model"] for row in cold} == set(ADAPTERS)  # the base is never cold
    assert all(row["cold_wait_s"] > 0 and row["cold_ttft_p95_s"] > 0 for row in cold)


def test_serve_shutdown_leaves_nothing_running(ray_app):
    assert serve_processes(), "the application runs Serve processes"
    stop_on_ray()
    wait_until(lambda: not serve_processes(), 60, "every Serve process to exit")
