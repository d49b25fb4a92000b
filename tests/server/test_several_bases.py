"""One server, two base models of different families: the official ``openai`` client's requests
for adapters of both, interleaved, each equal PEFT for its adapter on its base; with room for
one base, alternating and concurrent requests swap it and all complete; ``serve`` takes
several ``--model``, each with the engine settings it sets for its base."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from multilora_studio.deploy import BasePool
from multilora_studio.engine import EngineConfig
from multilora_studio.server import ApiServer, ServerConfig
from tests.engine.reference import PeftReference
from tests.fixtures import AdapterSpec, build_adapter
from tests.server_fixtures import GREEDY, client

NEW_TOKENS = 8
PROMPTS = ([1, 510, 2300, 44, 901], [1, 40000, 12, 7])
QWEN_ADAPTER = AdapterSpec("qwen-r8", 8, 16, ("q_proj", "v_proj", "down_proj"), 52)


def config(model) -> EngineConfig:
    return EngineConfig(model=str(model), device="cpu", dtype="float32", max_model_len=64, max_lora_rank=8)


@pytest.fixture(scope="module")
def bases(tiny_model_dir, tiny_family_models, tiny_adapters, tmp_path_factory):
    """The two bases' folders and adapters, and PEFT's greedy text for every (model, prompt)."""
    from transformers import AutoTokenizer

    qwen = tiny_family_models["qwen2"]
    adapters = {
        "tiny-r8-all": (tiny_model_dir, tiny_adapters["tiny-r8-all"]),
        "qwen-r8": (qwen, build_adapter(qwen, QWEN_ADAPTER, tmp_path_factory.mktemp("bases") / "qwen-r8")),
    }
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    expected = {}
    for name, (base, folder) in adapters.items():
        reference = PeftReference(base, {name: folder})
        for model, adapter in ((name, name), (base.name, None)):
            expected[model] = [
                tokenizer.decode(reference.greedy(adapter, list(p), NEW_TOKENS)) for p in PROMPTS
            ]
    return adapters, expected


def serve_pool(bases, **options) -> tuple[ApiServer, BasePool]:
    adapters, _ = bases
    pool = BasePool([config(adapters["tiny-r8-all"][0]), config(adapters["qwen-r8"][0])], **options)
    for name, (base, folder) in adapters.items():
        pool.register_adapter(base.name, name, folder)
    server = ApiServer(pool, ServerConfig(port=0))
    server.start()
    return server, pool


def complete(api: openai.OpenAI, model: str, prompt: tuple[int, ...]) -> str:
    answer = api.completions.create(model=model, prompt=list(prompt), max_tokens=NEW_TOKENS, **GREEDY)
    return answer.choices[0].text


def test_requests_for_two_bases_interleaved_each_equal_peft_on_their_base(bases):
    _, expected = bases
    server, pool = serve_pool(bases)
    try:
        api = client(server)
        cards = {m.id: m for m in api.models.list().data}
        llama, qwen = pool.names
        assert {name: getattr(cards[name], "parent", None) for name in cards} == {
            llama: None,
            "tiny-r8-all": llama,
            qwen: None,
            "qwen-r8": qwen,
        }
        jobs = [(model, i) for _ in range(3) for model in expected for i in range(len(PROMPTS))]
        with ThreadPoolExecutor(8) as workers:
            texts = list(workers.map(lambda job: complete(api, job[0], PROMPTS[job[1]]), jobs))
        for (model, i), text in zip(jobs, texts, strict=True):
            assert text == expected[model][i], (model, i)
        assert [pool.base(name).loads for name in pool.names] == [1, 1]  # colocated
        with pytest.raises(openai.NotFoundError):
            complete(api, "no-such-model", PROMPTS[0])
    finally:
        server.stop()
        pool.shutdown()


def test_with_room_for_one_base_requests_swap_it_wait_and_all_complete(bases):
    _, expected = bases
    server, pool = serve_pool(bases, max_resident=1)
    try:
        api = client(server)
        for model in ("qwen-r8", "tiny-r8-all", "qwen-r8"):  # alternating: a swap each time
            assert complete(api, model, PROMPTS[0]) == expected[model][0]
        llama, qwen = pool.names
        assert pool.base(qwen).loads == 2 and pool.base(llama).loads == 1
        # concurrent requests for both: those for the swapped-out base wait, none fails
        jobs = [(model, i) for model in ("tiny-r8-all", "qwen-r8") * 3 for i in range(len(PROMPTS))]
        with ThreadPoolExecutor(6) as workers:
            texts = list(workers.map(lambda job: complete(api, job[0], PROMPTS[job[1]]), jobs))
        for (model, i), text in zip(jobs, texts, strict=True):
            assert text == expected[model][i], (model, i)
        assert len(pool.resident()) == 1
        text = server.metrics.render().decode()
        assert f'base="{pool.resident()[0][0]}"' in text
    finally:
        server.stop()
        pool.shutdown()


def test_serve_takes_several_models(bases, tmp_path):
    adapters, expected = bases
    llama, llama_adapter = adapters["tiny-r8-all"]
    qwen = adapters["qwen-r8"][0]
    command = [
        sys.executable, "-m", "multilora_studio", "serve", "--port", "0", "--no-library",
        "--model", str(llama), "--model", f"{qwen},max-loras=2,kv-cache-gb=0.25",
        "--max-resident-bases", "1", "--keep-alive", "60",
        "--device", "cpu", "--dtype", "float32", "--max-model-len", "64", "--max-lora-rank", "8",
        "--lora-modules", f"tiny-r8-all={llama_adapter}",
    ]  # fmt: skip
    env = os.environ | {"MULTILORA_STUDIO_HOME": str(tmp_path / "home")}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = process.stdout.readline()
        assert line.startswith("serving ") and llama.name in line and qwen.name in line, (
            line,
            process.stderr.read(),
        )
        url = line.rsplit(" at ", 1)[1].strip()
        api = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
        assert complete(api, "tiny-r8-all", PROMPTS[1]) == expected["tiny-r8-all"][1]
        assert complete(api, qwen.name, PROMPTS[1]) == expected[qwen.name][1]  # swapped in
        with urllib.request.urlopen(url.removesuffix("/v1") + "/metrics", timeout=30) as reply:
            metrics = reply.read().decode()
        # qwen's engine has its own 2 slots (the flag's default: 8)
        assert f'multilora_gpu_slots_total{{base="{qwen.name}",replica="0"}} 2.0' in metrics, metrics
        assert complete(api, "tiny-r8-all", PROMPTS[0]) == expected["tiny-r8-all"][0]  # swapped back
        with urllib.request.urlopen(url.removesuffix("/v1") + "/metrics", timeout=30) as reply:
            metrics = reply.read().decode()
        assert f'multilora_gpu_slots_total{{base="{llama.name}",replica="0"}} 8.0' in metrics, metrics
        models = json.loads(api.models.with_raw_response.list().text)["data"]
        assert {m["id"] for m in models} == {llama.name, "tiny-r8-all", qwen.name}
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
