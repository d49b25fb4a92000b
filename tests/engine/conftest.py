"""Engine fixtures over the tiny model."""

from __future__ import annotations

import pytest
import torch

from multilora_studio.adapters.peft_adapter import load_peft_adapter
from multilora_studio.engine import Engine, EngineConfig
from multilora_studio.engine.lora_plan_builder import build_lora_plan
from multilora_studio.engine.lora_weights import pack_adapter
from multilora_studio.engine.model_source import resolve_model
from multilora_studio.engine.runner import ModelRunner
from tests.engine.reference import PeftReference


@pytest.fixture(scope="session")
def peft_reference(tiny_model_dir, tiny_adapters) -> PeftReference:
    return PeftReference(tiny_model_dir, tiny_adapters)


def tiny_engine_config(model_dir, **overrides) -> EngineConfig:
    """The tiny model's engine settings of these tests, with ``overrides`` (``device`` among them)."""
    settings = dict(
        model=str(model_dir),
        dtype="float32",
        max_loras=8,
        max_lora_rank=32,
        max_num_seqs=16,
        max_model_len=256,
        max_num_batched_tokens=512,
    )
    settings.update(overrides)
    return EngineConfig(**settings)


@pytest.fixture
def make_engine(tiny_model_dir, tiny_adapters, engine_device):
    """Build an engine on the tiny model with every fixture adapter added; shut down after the test."""
    engines: list[Engine] = []

    def build(adapters: list[str] | None = None, **overrides) -> Engine:
        engine = Engine(tiny_engine_config(tiny_model_dir, **{"device": engine_device, **overrides}))
        engines.append(engine)
        for name in tiny_adapters if adapters is None else adapters:
            engine.add_adapter(name, tiny_adapters[name])
        return engine

    yield build
    for engine in engines:
        engine.shutdown()


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_dir, tiny_adapters, engine_device):
    """One engine for the engine suite, as ``make_engine()`` builds it (default settings, every
    fixture adapter), for tests that only submit requests: they leave its adapters and settings
    as they found them, and nothing running when they end."""
    with Engine(tiny_engine_config(tiny_model_dir, device=engine_device)) as engine:
        for name, path in tiny_adapters.items():
            engine.add_adapter(name, path)
        yield engine


RUNNER_BLOCK = 4  # KV block size of runner_with_adapters


@pytest.fixture(scope="module")
def runner_with_adapters(tiny_model_dir, tiny_adapters):
    config = EngineConfig(
        model=str(tiny_model_dir),
        device="cpu",
        dtype="float32",
        max_loras=4,
        max_lora_rank=32,
        max_num_seqs=16,
        max_model_len=64,
        max_num_batched_tokens=256,
        block_size=RUNNER_BLOCK,
    )
    base = resolve_model(config.model, torch.float32, torch.device("cpu"), None)
    cpu = torch.device("cpu")
    runner = ModelRunner(
        config, base.spec, base.weights, 64, cpu, torch.float32, build_lora_plan(config, cpu, torch.float32)
    )
    names = ["tiny-r4-qv", "tiny-r8-all", "tiny-r16-mlp", "tiny-r32-ko-down"]
    for slot, name in enumerate(names):
        host = load_peft_adapter(
            name,
            tiny_adapters[name],
            base.spec.num_layers,
            base.spec.projection_shape,
            32,
            dtype=torch.float32,
        )
        runner.lora.upload(slot, pack_adapter(host, base.spec, torch.float32, pin=False))
    return runner, {name: slot for slot, name in enumerate(names)}
