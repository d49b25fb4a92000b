"""DoRA and LoRA-bias adapters served in one mixed batch with plain LoRA and base rows.

PEFT builds each adapter in the test (every trained tensor perturbed: A, B, B's bias, DoRA's
magnitude); greedy tokens of every row equal PEFT's for that adapter alone, float32, 32 new
tokens, on each LoRA path (the shrink in the kernels, in the GEMMs, and the fused q/k/v
epilogue: 4 tokens under the Triton interpreter on the CPU), on the tiny Llama and on phi3's
fused projections.
"""

from __future__ import annotations

import random

import pytest
import torch

from multilora_studio.engine import Engine, EngineConfig, SamplingParams
from multilora_studio.engine.batch.block_manager import BlockManager
from multilora_studio.engine.batch.scheduler import ScheduledChunk, StepPlan
from multilora_studio.engine.step.step_graphs import StepGraphs, batch_buckets
from multilora_studio.engine.step.step_staging import StepStaging
from tests.engine.conftest import RUNNER_BLOCK, capture_graphs_on, tiny_runner
from tests.engine.reference import PeftReference
from tests.engine.test_decode_staging import make_sequences
from tests.engine.test_model_families import PATHS, new_tokens
from tests.fixtures import ATTENTION_TARGETS, MLP_TARGETS, AdapterSpec, build_adapter

NEW_TOKENS = 32
KINDS = (
    AdapterSpec("dora-r8-all", 8, 16, tuple(ATTENTION_TARGETS + MLP_TARGETS), 21, (("use_dora", True),)),
    AdapterSpec(
        "bias-r4-qkv-down", 4, 8, ("q_proj", "k_proj", "v_proj", "down_proj"), 22, (("lora_bias", True),)
    ),
    AdapterSpec("lora-r16-mlp", 16, 8, tuple(MLP_TARGETS), 23),
    AdapterSpec("dora-r4-qv", 4, 4, ("q_proj", "v_proj"), 24, (("use_dora", True),)),
)
FUSED_KINDS = (
    AdapterSpec(
        "dora-fused", 8, 16, ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"), 25, (("use_dora", True),)
    ),
    AdapterSpec("bias-fused", 4, 8, ("qkv_proj", "gate_up_proj"), 26, (("lora_bias", True),)),
)
PROMPTS = [[1, 510, 2300, 44, 901], [1, 88, 3, 4, 5, 6], [1, 40000, 12, 7], [1, 2, 3], [1, 9000, 77]]


@pytest.fixture(scope="module")
def kinds(tiny_model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("adapter-kinds")
    adapters = {spec.name: build_adapter(tiny_model_dir, spec, folder / spec.name) for spec in KINDS}
    return adapters, PeftReference(tiny_model_dir, adapters)


def generate(base, adapters, engine_device, max_tokens: int = NEW_TOKENS, **config):
    engine_config = EngineConfig(
        model=str(base), device=engine_device, dtype="float32", max_lora_rank=16, max_model_len=128, **config
    )
    names = [*adapters, None]
    with Engine(engine_config) as engine:
        for name, path in adapters.items():
            engine.add_adapter(name, path)
        kinds = {info.name: info.kind for info in engine.list_adapters()}
        outputs = engine.generate(
            PROMPTS[: len(names)],
            names,
            SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True),
        )
    return names, outputs, kinds


# each LoRA path; and the adapters read and packed in the loader processes (their per-row
# vectors travel through the shared staging buffers)
CONFIGS = {**PATHS, "loader-process": dict(lora_shrink_in_gemm=False, adapter_loader="process")}


@pytest.mark.parametrize("path", list(CONFIGS))
def test_dora_and_lora_bias_in_a_mixed_batch_match_peft(path, kinds, tiny_model_dir, engine_device):
    adapters, reference = kinds
    count = new_tokens(path, engine_device, NEW_TOKENS)
    names, outputs, shown = generate(tiny_model_dir, adapters, engine_device, count, **CONFIGS[path])
    assert shown == {
        "dora-r8-all": "DoRA",
        "bias-r4-qkv-down": "LoRA with bias",
        "lora-r16-mlp": "LoRA",
        "dora-r4-qv": "DoRA",
    }
    for prompt, name, output in zip(PROMPTS, names, outputs, strict=False):
        assert output.token_ids == reference.greedy(name, prompt, count), name
    plain = [reference.greedy(None, prompt, count) for prompt in PROMPTS[: len(names)]]
    assert all(o.token_ids != p for o, p, n in zip(outputs, plain, names, strict=True) if n), (
        "an adapter did nothing"
    )


def test_dora_and_lora_bias_on_fused_projections_match_peft(tiny_family_models, tmp_path, engine_device):
    """phi3's fused qkv_proj / gate_up_proj: the magnitude and the bias are cut by rows with B."""
    base = tiny_family_models["phi3"]
    adapters = {spec.name: build_adapter(base, spec, tmp_path / spec.name) for spec in FUSED_KINDS}
    reference = PeftReference(base, adapters)
    names, outputs, _ = generate(base, adapters, engine_device, **PATHS["shrink-in-gemm"])
    for prompt, name, output in zip(PROMPTS, names, outputs, strict=False):
        assert output.token_ids == reference.greedy(name, prompt, NEW_TOKENS), name


def test_dora_refuses_an_adapter_strength(kinds, tiny_model_dir, engine_device):
    adapters, _ = kinds
    config = EngineConfig(model=str(tiny_model_dir), device=engine_device, dtype="float32", max_lora_rank=16)
    with Engine(config) as engine:
        engine.add_adapter("dora-r4-qv", adapters["dora-r4-qv"])
        with pytest.raises(ValueError, match="DoRA adapter"):
            engine.generate([PROMPTS[0]], ["dora-r4-qv"], SamplingParams(max_tokens=2, adapter_scale=0.5))


def test_lora_bias_follows_the_adapter_strength(kinds, tiny_model_dir, engine_device):
    """B's bias is part of the LoRA term: a strength of 0.5 or 2 scales it with B A (PEFT's scaling)."""
    adapters, reference = kinds
    name = "bias-r4-qkv-down"
    config = EngineConfig(model=str(tiny_model_dir), device=engine_device, dtype="float32", max_lora_rank=16)
    params = [
        SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True, adapter_scale=s)
        for s in (0.5, 2.0)
    ]
    with Engine(config) as engine:
        engine.add_adapter(name, adapters[name])
        outputs = engine.generate(PROMPTS[:2], [name, name], params)
    for prompt, param, output in zip(PROMPTS, params, outputs, strict=False):
        expected = reference.greedy(name, prompt, NEW_TOKENS, adapter_scale=param.adapter_scale)
        assert output.token_ids == expected, param.adapter_scale


@torch.inference_mode()
def test_step_graphs_with_the_per_row_terms_equal_the_eager_step(
    kinds, tiny_model_dir, engine_device, monkeypatch
):
    """The decode graphs run DoRA and bias rows through their per-row-terms capture, made on
    first use: equal to the eager step (graph capture stood in by eager replay on the CPU)."""
    adapters, _ = kinds
    capture_graphs_on(engine_device, monkeypatch)
    runner, slot_of = tiny_runner(tiny_model_dir, adapters, engine_device, max_lora_rank=16, max_num_seqs=8)
    staging = StepStaging(
        8, 8, runner.max_blocks_per_seq, 4, RUNNER_BLOCK, runner.device, one_token_per_seq=True
    )
    decode = StepGraphs(runner.model, runner.kv_caches, staging, batch_buckets(8), None)
    blocks = BlockManager(64, RUNNER_BLOCK)
    seqs = make_sequences(5, blocks, random.Random(3))
    for seq, adapter in zip(
        seqs, ["dora-r8-all", "bias-r4-qkv-down", None, "lora-r16-mlp", "dora-r4-qv"], strict=True
    ):
        seq.adapter = adapter
    plan = StepPlan([ScheduledChunk(s, s.num_tokens - 1, 1) for s in seqs])
    eager = runner.run(runner.prepare(plan, blocks, slot_of))[0].clone()
    replayed = runner.run(decode.stage(plan, slot_of, runner.lora.slot_ranks_host, uses_rows=True))[0].clone()
    assert (8, True, True, False, 0) in decode.graphs
    torch.testing.assert_close(replayed, eager, rtol=1e-5, atol=1e-5)
    without_rows = runner.run(decode.stage(plan, slot_of, runner.lora.slot_ranks_host))[0]
    assert not torch.allclose(without_rows, eager, rtol=1e-3, atol=1e-3)  # the rows matter
