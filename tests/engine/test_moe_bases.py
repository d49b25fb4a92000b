"""Mixture-of-experts bases (qwen3_moe, mixtral) served with attention LoRA.

Tiny random checkpoints built with transformers, stored per expert (as ``save_pretrained``
writes them) and with transformers 5's fused expert tensors: the engine's prompt
log-probabilities equal HF's float64 forward for both layouts; a batch of two attention
adapters and the base equals PEFT per adapter alone, token for token; expert and router LoRA
are refused when added, naming the module; configs the engine does not serve are refused by
name.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from multilora_studio.engine import Engine, EngineConfig, SamplingParams
from multilora_studio.engine.model.model_spec import spec_from_config
from tests.engine.reference import PeftReference
from tests.fixtures import ATTENTION_TARGETS, AdapterSpec, build_adapter

NEW_TOKENS = 16
TOLERANCE = 1e-4  # nats, as the family tests compare float32 log-probabilities
PROMPTS = ([1, 510, 2300, 44, 901, 7, 3000, 12], [1, 88, 3, 4, 5, 6], [1, 40000, 12, 7, 19])
ADAPTERS = (
    AdapterSpec("moe-r8-attn", 8, 16, tuple(ATTENTION_TARGETS), 21),
    AdapterSpec("moe-r4-qv", 4, 8, ("q_proj", "v_proj"), 22),
)
COMMON = dict(
    vocab_size=49152, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
    initializer_range=0.15, bos_token_id=1, eos_token_id=2, pad_token_id=2,
)  # fmt: skip
# qwen3_moe: 8 experts, top-2 renormalised, layer 1 dense (mlp_only_layers); mixtral: 4 experts
CONFIGS = {
    "qwen3_moe": dict(
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=48, intermediate_size=96,
        norm_topk_prob=True, mlp_only_layers=[1], use_sliding_window=False,
    ),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=80, sliding_window=None),
}  # fmt: skip


def build_moe_model(model_type: str, tokenizer_dir: Path, target: Path) -> tuple[Path, Path]:
    """The tiny model stored per expert (``save_pretrained``) and with fused expert tensors."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **COMMON, **CONFIGS[model_type])
    torch.manual_seed(4321)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # norm weights away from ones, so that they matter
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    per_expert, fused = target / "per-expert", target / "fused"
    model.save_pretrained(str(per_expert), safe_serialization=True)
    fused.mkdir(parents=True)
    config.save_pretrained(str(fused))
    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    assert any(name.endswith("mlp.experts.gate_up_proj") for name in state)  # transformers 5's layout
    save_file(state, str(fused / "model.safetensors"), metadata={"format": "pt"})
    for folder in (per_expert, fused):
        for item in tokenizer_dir.iterdir():
            shutil.copy(item, folder / item.name)
    return per_expert, fused


@pytest.fixture(scope="module", params=list(CONFIGS))
def moe_model(request, tmp_path_factory, tokenizer_dir) -> tuple[str, Path, Path]:
    model_type = request.param
    return model_type, *build_moe_model(model_type, tokenizer_dir, tmp_path_factory.mktemp(model_type))


def engine_config(model: Path, device: str, **fields) -> EngineConfig:
    return EngineConfig(
        model=str(model), device=device, dtype="float32", max_lora_rank=16, max_model_len=128, **fields
    )


def test_checkpoint_layouts_store_experts_as_expected(moe_model):
    """save_pretrained writes one tensor per expert projection; the fused folder, the stacks."""
    from safetensors import safe_open

    model_type, per_expert, fused = moe_model
    with safe_open(str(per_expert / "model.safetensors"), "pt") as handle:
        names = set(handle.keys())
    expert = "mlp.experts.0.gate_proj" if model_type == "qwen3_moe" else "block_sparse_moe.experts.0.w1"
    assert f"model.layers.0.{expert}.weight" in names
    with safe_open(str(fused / "model.safetensors"), "pt") as handle:
        assert "model.layers.0.mlp.experts.down_proj" in set(handle.keys())


def test_prompt_logprobs_equal_hf_float64_in_both_layouts(moe_model, engine_device):
    """Each prompt token's log-probability, per expert and fused, equals HF's float64 forward."""
    from transformers import AutoModelForCausalLM

    _, per_expert, fused = moe_model
    hf = AutoModelForCausalLM.from_pretrained(
        str(per_expert), dtype=torch.float64, experts_implementation="eager"
    ).eval()  # grouped_mm takes no float64
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True, prompt_logprobs=1)
    for folder in (per_expert, fused):
        with Engine(engine_config(folder, engine_device)) as engine:
            outputs = engine.generate(list(PROMPTS), [None] * len(PROMPTS), params)
        for ids, output in zip(PROMPTS, outputs, strict=True):
            with torch.no_grad():
                scores = torch.log_softmax(hf(torch.tensor([ids])).logits[0], dim=-1)  # [L, V]
            got = torch.tensor([output.prompt_logprobs[p].logprob for p in range(1, len(ids))])
            want = torch.stack([scores[p - 1, ids[p]] for p in range(1, len(ids))]).float()
            torch.testing.assert_close(got, want, rtol=TOLERANCE, atol=TOLERANCE)


@pytest.mark.parametrize("shrink_in_gemm", [False, True], ids=["kernel-shrink", "shrink-in-gemm"])
def test_mixed_batch_of_attention_adapters_matches_peft(moe_model, tmp_path, engine_device, shrink_in_gemm):
    """Two attention adapters and the base in one batch: greedy tokens equal PEFT's per adapter;
    the slots (and the shrink-in-GEMM rows) hold the attention groups only."""
    _, per_expert, _ = moe_model
    adapters = {spec.name: build_adapter(per_expert, spec, tmp_path / spec.name) for spec in ADAPTERS}
    reference = PeftReference(per_expert, adapters)
    names = [*adapters, None]
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
    config = engine_config(per_expert, engine_device, lora_shrink_in_gemm=shrink_in_gemm)
    with Engine(config) as engine:
        slots = engine.runner.lora
        assert set(slots.a) == set(slots.b) == {"qkv", "o"}  # no LoRA buffers for an MLP of experts
        assert set(engine.runner.weights.shrink_in_gemm_weights) == (
            {"qkv", "o"} if shrink_in_gemm else set()
        )
        for name, path in adapters.items():
            engine.add_adapter(name, path)
        outputs = engine.generate(list(PROMPTS), names, params)
    for prompt, name, output in zip(PROMPTS, names, outputs, strict=True):
        assert output.token_ids == reference.greedy(name, prompt, NEW_TOKENS), name


def with_tensors(source: Path, target: Path, extra: dict[str, torch.Tensor], **config_fields) -> Path:
    """A copy of the adapter at ``source`` with ``extra`` tensors and ``config_fields`` added."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, target)
    weights = {**load_file(str(source / "adapter_model.safetensors")), **extra}
    save_file(weights, str(target / "adapter_model.safetensors"))
    config = {**json.loads((source / "adapter_config.json").read_text()), **config_fields}
    (target / "adapter_config.json").write_text(json.dumps(config))
    return target


def test_expert_and_router_lora_is_refused_naming_the_module(moe_model, tmp_path, engine_device):
    """An adapter with LoRA on an expert, on the fused experts or on the router, or on the dense
    MLP of a mixture-of-experts base, is refused when added, naming what it targets."""
    model_type, per_expert, _ = moe_model
    attention = build_adapter(per_expert, ADAPTERS[1], tmp_path / "attention")
    layer = "base_model.model.model.layers.0"
    block = "mlp" if model_type == "qwen3_moe" else "block_sparse_moe"
    expert = f"{block}.experts.1.gate_proj" if model_type == "qwen3_moe" else f"{block}.experts.1.w1"
    a, b = torch.randn(4, 64), torch.randn(48, 4)
    cases = {
        f"{layer}.{expert}": with_tensors(
            attention, tmp_path / "expert", {f"{layer}.{expert}.lora_A.weight": a,
                                            f"{layer}.{expert}.lora_B.weight": b},
            target_modules="q_proj|v_proj|gate_proj|w1",
        ),
        f"{layer}.{block}.gate": with_tensors(
            attention, tmp_path / "router", {f"{layer}.{block}.gate.lora_A.weight": a,
                                            f"{layer}.{block}.gate.lora_B.weight": torch.randn(4, 4)},
            target_modules="q_proj|v_proj|gate",
        ),
        "mlp.experts.gate_up_proj": with_tensors(
            attention, tmp_path / "fused-experts", {}, target_parameters=["mlp.experts.gate_up_proj"]
        ),
        "LoRA on gate (": with_tensors(
            attention, tmp_path / "router-target", {}, target_modules=["gate", "q_proj"]
        ),
    }  # fmt: skip
    with Engine(engine_config(per_expert, engine_device)) as engine:
        for module, folder in cases.items():
            with pytest.raises(ValueError, match="expert LoRA is not served yet") as refused:
                engine.add_adapter(folder.name, folder)
            assert module in str(refused.value), str(refused.value)
        if model_type == "qwen3_moe":  # its layer 1 is dense: LoRA on its down_proj
            dense = AdapterSpec("mlp", 4, 8, ("q_proj", "layers.1.mlp.down_proj"), 23)
            mlp = build_adapter(per_expert, dense, tmp_path / "mlp")
            with pytest.raises(ValueError, match=r"down_proj .*mixture-of-experts base qwen3_moe"):
                engine.add_adapter("mlp", mlp)
        # the same adapter without them is served
        assert engine.add_adapter("attention", attention).targets == ("q_proj", "v_proj")


@pytest.mark.parametrize(
    ("model_type", "fields", "named"),
    [
        ("qwen3_moe", dict(shared_expert_intermediate_size=64), "shared_expert_intermediate_size"),
        ("qwen3_moe", dict(use_sliding_window=True, sliding_window=16), "use_sliding_window"),
        ("qwen3_moe", dict(num_experts_per_tok=9), "num_experts_per_tok"),
        ("qwen3_moe", dict(mlp_only_layers=[5]), "mlp_only_layers"),
        ("qwen3_moe", dict(decoder_sparse_step=0), "decoder_sparse_step"),
        ("mixtral", dict(num_experts_per_tok=5), "num_experts_per_tok"),
        ("mixtral", dict(num_local_experts=None), "num_local_experts"),
    ],
)
def test_unserved_moe_configs_are_refused_by_name(model_type, fields, named):
    config = {"model_type": model_type, **COMMON, **CONFIGS[model_type], **fields}
    with pytest.raises(ValueError, match=named):
        spec_from_config(config)


def test_sparse_layers_follow_mlp_only_layers_and_decoder_sparse_step():
    config = {"model_type": "qwen3_moe", **COMMON, **CONFIGS["qwen3_moe"], "num_hidden_layers": 4}
    spec = spec_from_config({**config, "mlp_only_layers": [0], "decoder_sparse_step": 2})
    assert spec.moe is not None and spec.moe.sparse_layers == (False, True, False, True)
    assert spec.lora_groups == ("qkv", "o")
    mixtral = spec_from_config({"model_type": "mixtral", **COMMON, **CONFIGS["mixtral"]})
    assert mixtral.moe is not None and mixtral.moe.norm_topk_prob and all(mixtral.moe.sparse_layers)
