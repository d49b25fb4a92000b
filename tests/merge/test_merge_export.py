"""Merging adapters into their base: the folder loads in transformers and equals PEFT's
``merge_and_unload``, tensor for tensor and in greedy tokens (float32), and this engine's
base + adapter; failures leave nothing at the destination."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from multilora_studio.adapters.adapter_config import AdapterError
from multilora_studio.checkpoint_files import checkpoint_digest, checkpoint_files
from multilora_studio.engine import Engine, EngineConfig, SamplingParams
from multilora_studio.merge import (
    AdapterSource,
    BaseSource,
    MergeCancelled,
    MergeError,
    MergeRequest,
    combine_adapters,
    merge_and_export,
    parse_shard_size,
)
from tests.adapter_fixtures import edit_tensors
from tests.engine.reference import greedy_tokens
from tests.fixtures import ATTENTION_TARGETS, MLP_TARGETS, AdapterSpec, build_adapter

PROMPTS = [[1, 510, 2300, 44, 901], [1, 40000, 12, 7]]
NEW_TOKENS = 12
DORA = AdapterSpec("dora-all", 8, 16, tuple(ATTENTION_TARGETS + MLP_TARGETS), 31, (("use_dora", True),))
QKV_BIAS = AdapterSpec("bias-qkv", 4, 8, ("q_proj", "k_proj", "v_proj"), 32, (("lora_bias", True),))
O_BIAS = AdapterSpec("bias-o", 4, 8, ("o_proj",), 33, (("lora_bias", True),))
FUSED = AdapterSpec("fused-r8", 8, 16, ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"), 34)


def request_for(base: Path, adapter: Path, out: Path, **options) -> MergeRequest:
    source = AdapterSource(adapter.name, str(adapter), "", "0" * 64, 8, ("q_proj",), "LoRA")
    return MergeRequest(base, BaseSource(base.name, "", "", ""), (adapter,), (source,), out, **options)


def peft_merged(base: Path, adapter: Path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    return PeftModel.from_pretrained(model, str(adapter)).merge_and_unload().eval()


def load_merged(folder: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


def assert_same_model(ours, reference) -> None:
    """Every parameter equal within float32 rounding, and the greedy tokens equal."""
    theirs = dict(reference.state_dict())
    mine = dict(ours.state_dict())
    assert set(mine) == set(theirs)
    for name, tensor in theirs.items():
        torch.testing.assert_close(mine[name], tensor, rtol=2e-6, atol=2e-6, msg=name)
    for prompt in PROMPTS:
        assert greedy_tokens(ours, prompt, NEW_TOKENS) == greedy_tokens(reference, prompt, NEW_TOKENS)


@pytest.fixture(scope="module")
def kinds(tiny_model_dir, tiny_family_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("merge-kinds")
    return {
        "dora": (tiny_model_dir, build_adapter(tiny_model_dir, DORA, root / "dora")),
        "qwen2-bias": (
            tiny_family_models["qwen2"],
            build_adapter(tiny_family_models["qwen2"], QKV_BIAS, root / "bias"),
        ),
        "phi3-fused": (
            tiny_family_models["phi3"],
            build_adapter(tiny_family_models["phi3"], FUSED, root / "f"),
        ),
    }


def test_a_plain_lora_merge_equals_peft_and_the_engine_serving_base_and_adapter(
    tiny_model_dir, tiny_adapters, tmp_path
):
    adapter = tiny_adapters["tiny-r8-all"]
    out = tmp_path / "merged"
    result = merge_and_export(request_for(tiny_model_dir, adapter, out, shard_bytes=parse_shard_size("1MB")))
    assert len(result.files) > 1 and (out / "model.safetensors.index.json").is_file()
    assert result.digest == checkpoint_digest(checkpoint_files(out))
    assert not out.with_name("merged.partial").exists()
    assert_same_model(load_merged(out), peft_merged(tiny_model_dir, adapter))
    card = (out / "README.md").read_text()
    assert "tiny-r8-all" in card and "base_model:" in card
    assert (out / "tokenizer.json").is_file() and (out / "generation_config.json").is_file()

    # the merged folder served as a base equals the original base serving the adapter
    greedy = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    settings = dict(device="cpu", dtype="float32", max_model_len=64, max_lora_rank=8)
    with Engine(EngineConfig(model=str(tiny_model_dir), **settings)) as engine:
        engine.add_adapter("tiny-r8-all", adapter)
        served = engine.generate(PROMPTS, ["tiny-r8-all"] * len(PROMPTS), greedy)
    with Engine(EngineConfig(model=str(out), **settings)) as engine:
        merged = engine.generate(PROMPTS, [None] * len(PROMPTS), greedy)
    assert [o.token_ids for o in merged] == [o.token_ids for o in served]


@pytest.mark.parametrize("kind", ["dora", "qwen2-bias", "phi3-fused"])
def test_dora_bias_and_fused_projections_merge_as_peft_merges_them(kinds, kind, tmp_path):
    base, adapter = kinds[kind]
    out = tmp_path / kind
    merge_and_export(request_for(base, adapter, out))
    assert_same_model(load_merged(out), peft_merged(base, adapter))


VOCABULARY_SIDES = {
    "lm_head": AdapterSpec("head", 4, 8, ("q_proj",), 36, (("modules_to_save", ["lm_head"]),)),
    "embed_and_head": AdapterSpec(
        "both", 4, 8, ("q_proj",), 37, (("modules_to_save", ["embed_tokens", "lm_head"]),)
    ),
    "trainable_tokens": AdapterSpec("tokens", 4, 8, ("v_proj",), 38, (("trainable_token_indices", [5, 6]),)),
}


@pytest.mark.parametrize("variant", sorted(VOCABULARY_SIDES))
def test_the_vocabulary_side_is_merged_and_a_tied_base_is_untied_when_its_sides_differ(
    tiny_model_dir, variant, tmp_path
):
    adapter = build_adapter(tiny_model_dir, VOCABULARY_SIDES[variant], tmp_path / variant)
    out = tmp_path / "merged"
    merge_and_export(request_for(tiny_model_dir, adapter, out))
    config = json.loads((out / "config.json").read_text())
    ours, reference = load_merged(out), peft_merged(tiny_model_dir, adapter)
    # retrained tokens change both sides alike; a module saved whole replaces only itself
    assert config.get("tie_word_embeddings", True) == (variant == "trainable_tokens")
    for prompt in PROMPTS:
        assert greedy_tokens(ours, prompt, NEW_TOKENS) == greedy_tokens(reference, prompt, NEW_TOKENS)
    for side in ("get_output_embeddings", "get_input_embeddings"):
        torch.testing.assert_close(
            getattr(ours, side)().weight, getattr(reference, side)().weight, rtol=0, atol=0
        )
    assert not torch.equal(ours.get_output_embeddings().weight, load_merged(tiny_model_dir).lm_head.weight)


def test_added_tokens_grow_the_vocabulary_and_bring_the_adapters_size(tiny_model_dir, tmp_path):
    spec = AdapterSpec("added", 4, 8, ("q_proj", "v_proj"), 35)
    adapter = build_adapter(tiny_model_dir, spec, tmp_path / "added", added_tokens=8)
    out = tmp_path / "merged"
    merge_and_export(request_for(tiny_model_dir, adapter, out))
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 49152 + 8
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    base.resize_token_embeddings(49152 + 8, mean_resizing=False)
    reference = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload().eval()
    ours = load_merged(out)
    for prompt in [*PROMPTS, [1, 49152 + 3, 49152 + 7]]:
        assert greedy_tokens(ours, prompt, NEW_TOKENS) == greedy_tokens(reference, prompt, NEW_TOKENS)


def test_bf16_output_is_cast_once_from_the_float32_merge(tiny_model_dir, tiny_adapters, tmp_path):
    adapter = tiny_adapters["tiny-r16-mlp"]
    out = tmp_path / "bf16"
    result = merge_and_export(request_for(tiny_model_dir, adapter, out, dtype=torch.bfloat16))
    assert result.dtype == torch.bfloat16
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    reference = peft_merged(tiny_model_dir, adapter).state_dict()
    with safe_open(str(out / "model.safetensors"), framework="pt") as handle:
        name = "model.layers.1.mlp.down_proj.weight"
        assert torch.equal(handle.get_tensor(name), reference[name].to(torch.bfloat16))


def test_refusals_name_the_problem_and_write_nothing(tiny_model_dir, tmp_path):
    bias_on_llama = build_adapter(tiny_model_dir, O_BIAS, tmp_path / "bias-o")
    out = tmp_path / "out"
    with pytest.raises(MergeError, match="has no bias in this base"):
        merge_and_export(request_for(tiny_model_dir, bias_on_llama, out))
    assert not out.exists() and not out.with_name("out.partial").exists()
    narrow = build_adapter(tiny_model_dir, QKV_BIAS, tmp_path / "narrow")
    edit_tensors(
        narrow,
        lambda tensors: tensors.update(
            {k: v[:, :32].contiguous() for k, v in tensors.items() if "lora_A" in k}
        ),
    )
    with pytest.raises(AdapterError, match="trained on a different base model"):
        merge_and_export(request_for(tiny_model_dir, narrow, out))
    out.mkdir()
    with pytest.raises(MergeError, match="already exists"):
        merge_and_export(request_for(tiny_model_dir, bias_on_llama, out))


def test_an_activated_lora_is_neither_merged_nor_combined(tiny_model_dir, tiny_adapters, tmp_path):
    """It applies only from its invocation on: merged weights would apply it everywhere."""
    spec = AdapterSpec("alora", 4, 8, ("q_proj", "v_proj"), 35, (("alora_invocation_tokens", [510, 2300]),))
    alora = build_adapter(tiny_model_dir, spec, tmp_path / "alora")
    out = tmp_path / "out"
    with pytest.raises(MergeError, match=r"alora: it is an activated LoRA \(alora_invocation_tokens\)"):
        merge_and_export(request_for(tiny_model_dir, alora, out))
    assert not out.exists() and not out.with_name("out.partial").exists()
    with pytest.raises(MergeError, match="it is aLoRA; only plain LoRA adapters have a weighted combination"):
        combine_adapters([alora, tiny_adapters["tiny-r4-qv"]], (1, 1), "cat", tmp_path / "combined", 3)


def test_a_cancelled_merge_leaves_nothing(tiny_model_dir, tiny_adapters, tmp_path):
    cancel = threading.Event()
    out = tmp_path / "cancelled"

    def progress(fraction: float, message: str) -> None:
        if fraction > 0.3:
            cancel.set()

    with pytest.raises(MergeCancelled):
        merge_and_export(request_for(tiny_model_dir, tiny_adapters["tiny-r4-qv"], out), progress, cancel)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


FULL_DISK = """
import resource, signal, sys
from pathlib import Path
from tests.merge.test_merge_export import request_for
from multilora_studio.merge import merge_and_export
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (2_000_000, 2_000_000))
base, adapter, out = map(Path, sys.argv[1:])
try:
    merge_and_export(request_for(base, adapter, out))
except OSError as error:
    print("OSError", error.errno)
"""


def test_a_full_disk_fails_with_an_os_error_and_leaves_nothing(tiny_model_dir, tiny_adapters, tmp_path):
    out = tmp_path / "full"
    run = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(tiny_model_dir), str(tiny_adapters["tiny-r4-qv"]), str(out)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        timeout=300,
    )
    assert "OSError 27" in run.stdout, run.stderr  # EFBIG
    assert sorted(p.name for p in tmp_path.iterdir()) == []
