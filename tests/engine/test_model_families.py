"""qwen2 (q/k/v biases) and mistral checkpoints run in our model code and match PEFT."""

from __future__ import annotations

import pytest

from multilora_studio.engine import Engine, EngineConfig, SamplingParams
from tests.engine.reference import PeftReference
from tests.fixtures import TINY_ADAPTERS, build_adapter

SPECS = [TINY_ADAPTERS[1], TINY_ADAPTERS[3]]


@pytest.mark.parametrize("shrink_in_gemm", [False, True], ids=["kernel-shrink", "shrink-in-gemm"])
@pytest.mark.parametrize("architecture", ["qwen2", "mistral"])
def test_family_mixed_batch_matches_peft(
    architecture, shrink_in_gemm, tiny_family_models, tmp_path, engine_device
):
    base = tiny_family_models[architecture]
    adapters = {spec.name: build_adapter(base, spec, tmp_path / spec.name) for spec in SPECS}
    reference = PeftReference(base, adapters)
    config = EngineConfig(
        model=str(base),
        device=engine_device,
        dtype="float32",
        max_lora_rank=32,
        max_model_len=128,
        lora_shrink_in_gemm=shrink_in_gemm,
    )
    with Engine(config) as engine:
        for name, path in adapters.items():
            engine.add_adapter(name, path)
        names = [*adapters, None]
        prompts = [engine.encode(p) for p in ("Hello world, this is", "Numbers: 1 2 3", "Why is the sky")]
        outputs = engine.generate(
            prompts, names, SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
        )
    for prompt, name, output in zip(prompts, names, outputs, strict=True):
        assert output.token_ids == reference.greedy(name, prompt, 32), (architecture, name)
