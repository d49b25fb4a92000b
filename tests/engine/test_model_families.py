"""Every family and checkpoint form the engine serves runs in our model code and matches PEFT.

qwen2 (q/k/v biases), mistral, qwen3 (q/k norms per head), yarn and longrope RoPE, a tied
Llama 3.2 stored in fp16 with the shared matrix only as ``lm_head.weight``, and a sharded,
tokenizer-less bf16 checkpoint: greedy tokens of two adapters (different ranks and targets)
and the base in one batch, each equal to PEFT's for that adapter alone.
"""

from __future__ import annotations

import re

import pytest

from multilora_studio.engine import Engine, EngineConfig, SamplingParams
from tests.engine.reference import PeftReference
from tests.fixtures import TINY_ADAPTERS, build_adapter

SPECS = [TINY_ADAPTERS[1], TINY_ADAPTERS[3]]
NEW_TOKENS = 32
# how the LoRA term and the q/k/v epilogue run: EngineConfig fields
PATHS = {
    "kernel-shrink": dict(lora_shrink_in_gemm=False),
    "shrink-in-gemm": dict(lora_shrink_in_gemm=True),
    "fused-qkv": dict(lora_shrink_in_gemm=True, fused_qkv_epilogue=True),  # Triton (interpreter on CPU)
}
CASES = [
    ("qwen2", "kernel-shrink"),
    ("qwen2", "shrink-in-gemm"),
    ("mistral", "kernel-shrink"),
    ("mistral", "shrink-in-gemm"),
    ("qwen3", "kernel-shrink"),
    ("qwen3", "shrink-in-gemm"),
    ("qwen2-yarn", "kernel-shrink"),
    ("qwen3-yarn", "fused-qkv"),
    ("llama3.2-tied", "shrink-in-gemm"),
    ("llama-sharded-bf16-no-tokenizer", "kernel-shrink"),
]
TEXTS = ("Hello world, this is", "Numbers: 1 2 3", "Why is the sky")


def family_prompts(engine: Engine) -> list[list[int]]:
    """Three short prompts: the texts encoded, or token ids where the model has no tokenizer
    (where text is a clear error naming the folder)."""
    if engine.tokenizer is None:
        with pytest.raises(ValueError, match=re.escape(f"{engine.base.folder} has no tokenizer")):
            engine.encode(TEXTS[0])
        return [[1, 510, 2300, 44, 901], [1, 88, 3, 4, 5, 6], [1, 40000, 12, 7]]
    return [engine.encode(text) for text in TEXTS]


def run_mixed_batch(base, adapters, prompts_of, engine_device, **config) -> tuple[list, list]:
    """Prompts and greedy outputs of every adapter and the base in one batch."""
    engine_config = EngineConfig(
        model=str(base), device=engine_device, dtype="float32", max_lora_rank=32, max_model_len=128, **config
    )
    with Engine(engine_config) as engine:
        for name, path in adapters.items():
            engine.add_adapter(name, path)
        prompts = prompts_of(engine)
        names = [*adapters, None][: len(prompts)]
        outputs = engine.generate(
            prompts, names, SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
        )
    return list(zip(prompts, names, strict=True)), outputs


@pytest.mark.parametrize(("variant", "path"), CASES, ids=[f"{v}-{p}" for v, p in CASES])
def test_family_mixed_batch_matches_peft(variant, path, tiny_family_models, tmp_path, engine_device):
    base = tiny_family_models[variant]
    adapters = {spec.name: build_adapter(base, spec, tmp_path / spec.name) for spec in SPECS}
    reference = PeftReference(base, adapters)
    rows, outputs = run_mixed_batch(base, adapters, family_prompts, engine_device, **PATHS[path])
    for (prompt, name), output in zip(rows, outputs, strict=True):
        assert output.token_ids == reference.greedy(name, prompt, NEW_TOKENS), (variant, name)


def test_longrope_picks_short_or_long_factors_per_sequence_as_peft(
    tiny_family_models, tmp_path, engine_device
):
    """A sequence that stays within ``original_max_position_embeddings`` (64) uses the short
    factors, one longer from its prompt on the long ones, in the same batch (as HF decides)."""
    base = tiny_family_models["llama-longrope"]
    adapters = {spec.name: build_adapter(base, spec, tmp_path / spec.name) for spec in SPECS}
    reference = PeftReference(base, adapters)
    short = [1, *range(300, 309)]  # 10 + 32 new tokens <= 64
    long, longer = [1, *range(500, 569)], [1, *range(900, 979)]  # 70 and 80 > 64

    def prompts_of(engine: Engine) -> list[list[int]]:
        return [short, long, longer]

    rows, outputs = run_mixed_batch(base, adapters, prompts_of, engine_device, **PATHS["kernel-shrink"])
    for (prompt, name), output in zip(rows, outputs, strict=True):
        assert output.token_ids == reference.greedy(name, prompt, NEW_TOKENS), name
