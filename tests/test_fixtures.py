"""The tiny fixture model and adapters are real, loadable and non-trivial."""

import json

import torch
from safetensors.torch import load_file

from tests.fixtures import TINY_ADAPTERS


def test_tiny_model_generates_with_transformers(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    ids = tokenizer("Hello there", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 5
    assert sum(p.numel() for p in model.parameters()) < 5_000_000


def test_tiny_adapters_have_declared_rank_and_nonzero_weights(tiny_adapters):
    for spec in TINY_ADAPTERS:
        folder = tiny_adapters[spec.name]
        config = json.loads((folder / "adapter_config.json").read_text())
        assert config["r"] == spec.rank
        assert set(config["target_modules"]) == set(spec.targets)
        tensors = load_file(str(folder / "adapter_model.safetensors"))
        b_weights = [t for name, t in tensors.items() if "lora_B" in name]
        assert b_weights and all(torch.count_nonzero(t) > 0 for t in b_weights)
        assert all(t.shape[0] == spec.rank for name, t in tensors.items() if "lora_A" in name)
