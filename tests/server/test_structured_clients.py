"""Real clients' structured-output helpers against the embedded SmolLM2 model and one of its demo
adapters on a loopback server: openai's ``chat.completions.parse``, litellm's JSON mode,
LangChain's ``with_structured_output``."""

from __future__ import annotations

import json

import openai
import pytest
from pydantic import BaseModel, Field

from multilora_studio.demo import demo_adapter_dirs
from multilora_studio.engine import Engine, EngineConfig
from multilora_studio.server import ApiServer, ServerConfig

QUESTION = "What is the capital of France? Answer in JSON with the keys country and city."


class Capital(BaseModel):
    country: str = Field(max_length=40)
    city: str = Field(max_length=40)


@pytest.fixture(scope="module")
def smol_server(default_model):
    config = EngineConfig(model=str(default_model.path), device="cpu", max_num_seqs=4, max_model_len=1024)
    with Engine(config) as engine:
        name, folder = next(iter(demo_adapter_dirs().items()))
        engine.add_adapter(name, folder)
        server = ApiServer(engine, ServerConfig(port=0))
        server.start()
        try:
            yield server, {"base": engine.model_name, "adapter": name}
        finally:
            server.stop()


# Each request generates on SmolLM2 on the CPU: openai's helper runs on the base and the adapter,
# litellm and LangChain once each, one on the base and one on the adapter.
@pytest.mark.parametrize("which", ["base", "adapter"])
def test_openai_parse_returns_the_pydantic_object(smol_server, which):
    server, models = smol_server
    model = models[which]
    api = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)
    completion = api.chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": QUESTION}],
        response_format=Capital,
        temperature=0,
        max_tokens=80,
    )
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Capital)
    assert completion.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("which", ["base"])
def test_litellm_json_mode_gives_a_json_object(smol_server, which):
    import litellm

    server, models = smol_server
    model = models[which]
    response = litellm.completion(
        model=f"openai/{model}",
        api_base=f"{server.url}/v1",
        api_key="unused",
        messages=[{"role": "user", "content": QUESTION}],
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=80,
    )
    assert isinstance(json.loads(response.choices[0].message.content), dict)


@pytest.mark.parametrize("which", ["adapter"])
def test_langchain_structured_output_parses(smol_server, which):
    from langchain_openai import ChatOpenAI

    server, models = smol_server
    model = models[which]
    chat = ChatOpenAI(
        model=model, base_url=f"{server.url}/v1", api_key="unused", temperature=0, max_tokens=80, timeout=300
    )
    answer = chat.with_structured_output(Capital, method="json_schema").invoke(QUESTION)
    assert isinstance(answer, Capital)
