"""Builders for the tiny test model and its PEFT adapters (used by tests/conftest.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

ATTENTION_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP_TARGETS = ["gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class AdapterSpec:
    """How one fixture adapter is made."""

    name: str
    rank: int
    alpha: int
    targets: tuple[str, ...]
    seed: int


TINY_ADAPTERS = (
    AdapterSpec("tiny-r4-qv", 4, 8, ("q_proj", "v_proj"), 11),
    AdapterSpec("tiny-r8-all", 8, 16, tuple(ATTENTION_TARGETS + MLP_TARGETS), 12),
    AdapterSpec("tiny-r16-mlp", 16, 8, tuple(MLP_TARGETS), 13),
    AdapterSpec("tiny-r32-ko-down", 32, 64, ("k_proj", "o_proj", "down_proj"), 14),
    AdapterSpec("tiny-r8-attn", 8, 32, tuple(ATTENTION_TARGETS), 15),
)


def extract_tokenizer(gguf_file: Path, target: Path) -> Path:
    """Write the default model's tokenizer (read from its GGUF file) into ``target``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    tokenizer.save_pretrained(str(target))
    return target


def build_tiny_model(tokenizer_dir: Path, target: Path, architecture: str = "llama") -> Path:
    """A random-weight model of the Llama family (a few MB) with the default tokenizer."""
    import shutil

    from transformers import AutoConfig, AutoModelForCausalLM

    common: dict[str, object] = dict(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        initializer_range=0.15,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    if architecture == "qwen2":
        common.update(use_sliding_window=False)
    if architecture == "mistral":
        common.update(sliding_window=None, head_dim=16)
    config = AutoConfig.for_model(architecture, **common)
    torch.manual_seed(1234)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(str(target), safe_serialization=True)
    for item in tokenizer_dir.iterdir():
        shutil.copy(item, target / item.name)
    return target


def build_adapter(base_dir: Path, spec: AdapterSpec, target: Path) -> Path:
    """A PEFT LoRA adapter with random, non-zero A and B for the model at ``base_dir``."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    config = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        target_modules=list(spec.targets),
        lora_dropout=0.0,
        init_lora_weights=False,
        task_type="CAUSAL_LM",
    )
    torch.manual_seed(spec.seed)
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn_like(param) * (0.3 if "lora_A" in name else 0.2))
    peft_model.save_pretrained(str(target), safe_serialization=True)
    return target
