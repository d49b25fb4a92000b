"""Identifying base models: names, digests, and clear errors for what cannot be loaded."""

from __future__ import annotations

import json
import shutil

import pytest

from multilora_studio.engine.model_source import describe_model, display_name
from multilora_studio.engine.model_spec import load_spec
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
