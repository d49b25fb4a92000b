"""Adapters that replace vocabulary rows, built by PEFT for the tiny model (shared by the
engine, server and GUI tests), and PEFT's own model of each for reference."""

from __future__ import annotations

import pytest
import torch

from tests.fixtures import AdapterSpec, build_adapter

ADDED = 8
RETRAINED = (510, 2300, 88)
SPECS = {
    "head": AdapterSpec("head", 8, 16, ("q_proj", "v_proj"), 31, (("modules_to_save", ["lm_head"]),)),
    "embed": AdapterSpec(
        "embed", 4, 8, ("o_proj", "down_proj"), 32, (("modules_to_save", ["embed_tokens"]),)
    ),
    "tokens": AdapterSpec("tokens", 4, 8, ("q_proj",), 33, (("trainable_token_indices", list(RETRAINED)),)),
    "added": AdapterSpec("added", 8, 16, ("q_proj", "k_proj", "v_proj", "gate_proj"), 34),
    "plain": AdapterSpec("plain", 8, 8, ("up_proj", "down_proj"), 35),
    "dora": AdapterSpec(
        "dora", 8, 16, ("q_proj", "v_proj", "gate_proj", "down_proj"), 36, (("use_dora", True),)
    ),
    "bias": AdapterSpec("bias", 4, 8, ("k_proj", "o_proj", "up_proj"), 37, (("lora_bias", True),)),
}
TEMPLATE = (
    "{% for m in messages %}<|turn|>{{ m['role'] }}\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|turn|>assistant\n{% endif %}"
)


@pytest.fixture(scope="session")
def table_adapters(tiny_model_dir, tokenizer_dir, tmp_path_factory):
    """name -> the folder of each adapter in SPECS (the added-token one with its tokenizer files)."""
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("token-tables")
    adapters = {}
    for name, spec in SPECS.items():
        adapters[name] = build_adapter(
            tiny_model_dir, spec, folder / name, added_tokens=ADDED if name == "added" else 0
        )
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|turn|>", "<|end|>"]})
    tokenizer.add_tokens([f"<extra_{i}>" for i in range(ADDED - 2)])
    tokenizer.eos_token = "<|end|>"
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(str(adapters["added"]))
    return adapters


@pytest.fixture(scope="session")
def references(table_adapters, tiny_model_dir):
    """name -> the PEFT model of that adapter alone (the added-token one on a resized base)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    models = {}
    for name, path in table_adapters.items():
        base = AutoModelForCausalLM.from_pretrained(
            str(tiny_model_dir), dtype=torch.float32, attn_implementation="eager"
        )
        if name == "added":
            base.resize_token_embeddings(base.config.vocab_size + ADDED, mean_resizing=False)
        models[name] = PeftModel.from_pretrained(base, str(path)).eval()
    models[None] = AutoModelForCausalLM.from_pretrained(
        str(tiny_model_dir), dtype=torch.float32, attn_implementation="eager"
    ).eval()
    return models


def prompts_for(vocab: int) -> dict[str | None, list[int]]:
    added = [vocab + i for i in range(ADDED)]
    return {
        "head": [1, 510, 2300, 44, 901],
        "embed": [1, 88, 3, 4, 5, 6, 510],
        "tokens": [1, 510, 12, 2300, 7, 88, 88],
        "added": [1, added[0], 40, added[3], 41, added[7], 9000],
        "plain": [1, 9000, 77, 510],
        "dora": [1, 510, 2300, 6, 7],
        "bias": [1, 88, 44, 2300],
        None: [1, 2, 3, 510, 2300],
    }
