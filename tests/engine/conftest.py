"""Engine fixtures over the tiny model."""

from __future__ import annotations

import pytest

from multilora_studio.engine import Engine, EngineConfig
from tests.engine.reference import PeftReference


@pytest.fixture(scope="session")
def peft_reference(tiny_model_dir, tiny_adapters) -> PeftReference:
    return PeftReference(tiny_model_dir, tiny_adapters)


@pytest.fixture
def make_engine(tiny_model_dir, tiny_adapters, engine_device):
    """Build an engine on the tiny model with every fixture adapter added; shut down after the test."""
    engines: list[Engine] = []

    def build(adapters: list[str] | None = None, **overrides) -> Engine:
        settings = dict(
            model=str(tiny_model_dir),
            device=engine_device,
            dtype="float32",
            max_loras=8,
            max_lora_rank=32,
            max_num_seqs=16,
            max_model_len=256,
            max_num_batched_tokens=512,
        )
        settings.update(overrides)
        engine = Engine(EngineConfig(**settings))
        engines.append(engine)
        for name in tiny_adapters if adapters is None else adapters:
            engine.add_adapter(name, tiny_adapters[name])
        return engine

    yield build
    for engine in engines:
        engine.shutdown()
