"""Random PEFT LoRA adapters of a given shape, written as real adapter folders."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from multilora_studio.engine.model.model_spec import PROJECTIONS, ModelSpec

KINDS = ("LoRA", "DoRA", "LoRA with bias")  # AdapterConfig.kind
TABLES = ("", "lm_head", "tokens")  # the vocabulary rows it replaces: none, a whole head, 16 tokens
TRAINED_TOKENS = 16


def write_random_adapter(
    spec: ModelSpec,
    folder: Path,
    rank: int,
    targets: tuple[str, ...] = PROJECTIONS,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    kind: str = "LoRA",
    tables: str = "",
) -> Path:
    """A PEFT folder with random A and B (std chosen so the adapter visibly changes outputs).

    ``kind``: "LoRA", "DoRA" (with a random magnitude around 1 per output row) or
    "LoRA with bias" (a random lora_B bias). ``tables``: "lm_head" (a whole random head,
    modules_to_save) or "tokens" (``TRAINED_TOKENS`` retrained embedding rows).
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if tables not in TABLES:
        raise ValueError(f"tables must be one of {', '.join(map(repr, TABLES))}, got {tables!r}")
    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(spec.num_layers):
        for module in targets:
            out_features, in_features = spec.projection_shape(module)
            block = "self_attn" if module in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{block}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, in_features, generator=generator) * (
                in_features**-0.5
            )
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out_features, rank, generator=generator) * 0.02
            if kind == "DoRA":
                tensors[f"{prefix}.lora_magnitude_vector"] = 1 + 0.1 * torch.randn(
                    out_features, generator=generator
                )
            elif kind == "LoRA with bias":
                tensors[f"{prefix}.lora_B.bias"] = torch.randn(out_features, generator=generator) * 0.02
    hidden = spec.hidden_size
    if tables == "lm_head":
        tensors["base_model.model.lm_head.weight"] = (
            torch.randn(spec.vocab_size, hidden, generator=generator) * 0.02
        )
    token_ids = torch.randperm(spec.vocab_size, generator=generator)[:TRAINED_TOKENS].tolist()
    if tables == "tokens":
        key = "base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta"
        tensors[key] = torch.randn(TRAINED_TOKENS, hidden, generator=generator) * 0.02
        if not spec.tie_word_embeddings:  # untied: the head's rows too, under trainable_token_indices
            tensors[key.replace("model.embed_tokens", "lm_head")] = tensors[key].clone()
    save_file({k: v.to(dtype) for k, v in tensors.items()}, str(folder / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": list(targets),
        "lora_dropout": 0.0,
        "bias": "none",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": None,
        "use_dora": kind == "DoRA",
        "lora_bias": kind == "LoRA with bias",
        "modules_to_save": ["lm_head"] if tables == "lm_head" else None,
        "trainable_token_indices": (
            None
            if tables != "tokens"
            else token_ids
            if spec.tie_word_embeddings
            else {"embed_tokens": token_ids, "lm_head": token_ids}
        ),
    }
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return folder
