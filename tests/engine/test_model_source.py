"""Identifying base models: names, digests, and clear errors for what cannot be loaded."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from multilora_studio.adapters.adapter_tokenizer import load_tokenizer
from multilora_studio.adapters.safetensors_header import read_header
from multilora_studio.checkpoint_files import checkpoint_files
from multilora_studio.engine.model.model_source import (
    check_model_folder,
    describe_model,
    display_name,
)
from multilora_studio.engine.model.model_spec import load_spec
from multilora_studio.engine.model.weights import load_weights
from multilora_studio.engine.text.prompts import encode_prompt
from multilora_studio.util import sha256_file


def test_hub_cache_snapshots_are_named_by_their_repository(tmp_path):
    snapshot = tmp_path / "models--HuggingFaceTB--SmolLM2-135M-Instruct" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    assert display_name(snapshot) == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert display_name(tmp_path / "my-model") == "my-model"


def test_describe_model_digests_the_weights(tiny_model_dir):
    identity = describe_model(str(tiny_model_dir))
    assert identity.name == tiny_model_dir.name
    assert identity.digest == sha256_file(tiny_model_dir / "model.safetensors")


def test_missing_folder_and_unsupported_architecture_are_clear_errors(tiny_model_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        describe_model(str(tmp_path / "nowhere"))
    other = tmp_path / "gpt2-like"
    shutil.copytree(tiny_model_dir, other)
    config = json.loads((other / "config.json").read_text())
    config["model_type"] = "gpt2"
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        load_spec(other)


def test_sharded_checkpoints_get_a_digest_over_every_shard(tiny_family_models, tmp_path):
    sharded = tiny_family_models["llama-sharded-bf16-no-tokenizer"]
    shards = checkpoint_files(sharded)
    assert len(shards) > 1 and all(path.name.startswith("model-0000") for path in shards)
    digest = describe_model(str(sharded)).digest
    assert digest and digest != sha256_file(shards[0])
    copy = tmp_path / "copy"
    shutil.copytree(sharded, copy)
    assert describe_model(str(copy)).digest == digest  # stable across copies
    last = copy / shards[-1].name
    tensors = load_file(str(last))
    name = next(iter(tensors))
    tensors[name] = tensors[name] + 1
    save_file(tensors, str(last), metadata={"format": "pt"})
    assert describe_model(str(copy)).digest != digest  # any shard's content counts
    check_model_folder(sharded)
    last.unlink()
    with pytest.raises(
        FileNotFoundError, match=re.escape(f"{last.name} is listed in the safetensors index but missing")
    ):
        check_model_folder(copy)


def test_stored_dtypes_load_as_the_engine_dtype(tiny_family_models):
    """bf16 shards and an fp16 file load into float32 weights equal to the stored values."""
    for variant in ("llama-sharded-bf16-no-tokenizer", "llama3.2-tied"):
        folder = tiny_family_models[variant]
        spec = load_spec(folder)
        weights = load_weights(folder, spec, torch.float32, torch.device("cpu"))
        stored = {}
        for path in checkpoint_files(folder):
            stored.update(load_file(str(path)))
        down = stored["model.layers.1.mlp.down_proj.weight"]
        assert down.dtype in (torch.bfloat16, torch.float16)
        assert torch.equal(weights.layers[1].down, down.float())


def test_a_tied_matrix_stored_only_as_lm_head_is_the_embedding(tiny_family_models):
    folder = tiny_family_models["llama3.2-tied"]
    names = set(read_header(folder / "model.safetensors"))
    assert "lm_head.weight" in names and "model.embed_tokens.weight" not in names
    spec = load_spec(folder)
    assert spec.tie_word_embeddings
    weights = load_weights(folder, spec, torch.float32, torch.device("cpu"))
    lm_head = load_file(str(folder / "model.safetensors"))["lm_head.weight"]
    assert torch.equal(weights.embed, lm_head.float()) and weights.lm_head is weights.embed


def test_a_folder_without_tokenizer_serves_token_ids_and_names_itself_for_text(tiny_family_models):
    folder = tiny_family_models["llama-sharded-bf16-no-tokenizer"]
    assert load_tokenizer(folder) is None
    assert encode_prompt([1, 5, 9], None, 100, model=str(folder)) == [1, 5, 9]
    with pytest.raises(ValueError, match=re.escape(f"{folder} has no tokenizer")):
        encode_prompt("some text", None, 100, model=str(folder))


def test_unsupported_tensors_and_rope_types_are_named(tiny_model_dir, tmp_path):
    partial = tmp_path / "partial"
    shutil.copytree(tiny_model_dir, partial)
    tensors = load_file(str(partial / "model.safetensors"))
    del tensors["model.layers.2.mlp.up_proj.weight"]
    save_file(tensors, str(partial / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=re.escape("lacks tensor 'model.layers.2.mlp.up_proj.weight'")):
        load_weights(partial, load_spec(partial), torch.float32, torch.device("cpu"))
    config = json.loads((partial / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    (partial / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError, match=r"RoPE scaling type 'dynamic' is not supported \(supported: default, "
    ):
        load_spec(partial)
