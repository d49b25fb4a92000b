"""Resolving ``EngineConfig.model`` to weights: a HF folder, the embedded default, or random shapes."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from multilora_studio.adapters.adapter_tokenizer import load_tokenizer
from multilora_studio.adapters.safetensors_header import read_header
from multilora_studio.checkpoint_files import checkpoint_digest, checkpoint_files
from multilora_studio.default_model import ensure_default_model
from multilora_studio.engine.model.model_spec import ModelSpec, RopeSpec, load_spec
from multilora_studio.engine.model.quantization import Quantization, checkpoint_quantization
from multilora_studio.engine.model.weights import ModelWeights, load_weights, random_weights
from multilora_studio.kernels.quant_linear import QuantPlan
from multilora_studio.util import ProgressCallback

RANDOM_PREFIX = "random:"
# Named shapes for random-weight models (benchmarks without a download).
RANDOM_SHAPES: dict[str, ModelSpec] = {
    "llama3-8b": ModelSpec(
        model_type="llama",
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        attention_bias=False,
        max_position_embeddings=8192,
        rope=RopeSpec(theta=500000.0, kind="llama3", factor=8.0, original_max_position=8192),
        eos_token_ids=(128009,),
    ),
    "qwen3-8b": ModelSpec(
        model_type="qwen3",
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        num_layers=36,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        attention_bias=False,
        max_position_embeddings=40960,
        rope=RopeSpec(theta=1000000.0, original_max_position=40960),
        eos_token_ids=(151645,),
        qk_norm=True,
    ),
    "gemma2-9b": ModelSpec(
        model_type="gemma2",
        vocab_size=256000,
        hidden_size=3584,
        intermediate_size=14336,
        num_layers=42,
        num_heads=16,
        num_kv_heads=8,
        head_dim=256,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        attention_bias=False,
        max_position_embeddings=8192,
        rope=RopeSpec(theta=10000.0, original_max_position=8192),
        eos_token_ids=(1,),
        layer_windows=(4096, None) * 21,
        activation="gelu_tanh",
        gemma=True,
        attention_scale=256.0**-0.5,
        attn_softcap=50.0,
        final_softcap=30.0,
    ),
    "llama3.2-1b": ModelSpec(
        model_type="llama",
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        attention_bias=False,
        max_position_embeddings=131072,
        rope=RopeSpec(theta=500000.0, kind="llama3", factor=32.0, original_max_position=8192),
        eos_token_ids=(128009,),
    ),
    "smollm2-135m": ModelSpec(
        model_type="llama",
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        attention_bias=False,
        max_position_embeddings=8192,
        rope=RopeSpec(theta=100000.0),
        eos_token_ids=(2,),
    ),
}


@dataclass
class BaseModel:
    """A loaded base model: its name, spec, weights, tokenizer (None for random shapes) and digest."""

    name: str
    spec: ModelSpec
    weights: ModelWeights
    tokenizer: Any
    digest: str
    folder: Path | None


@dataclass(frozen=True)
class ModelIdentity:
    """Where a base model's folder is, its name, and the SHA-256 of its weights.

    The digest is ``checkpoint_digest`` of its safetensors files (one file or every shard);
    the embedded model's digest is recorded when it is converted.
    """

    folder: Path
    name: str
    digest: str


def describe_model(model: str | None, progress: ProgressCallback | None = None) -> ModelIdentity:
    """Identify a HF model folder, or the embedded default model when ``model`` is None."""
    if model is None:
        default = ensure_default_model(progress)
        return ModelIdentity(default.path, default.name, default.digest)
    folder = Path(model).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"model folder {folder} does not exist")
    digest = checkpoint_digest(checkpoint_files(folder))
    return ModelIdentity(folder, display_name(folder), digest)


def display_name(folder: Path) -> str:
    """The folder's name, or ``org/name`` for a snapshot in the Hugging Face cache."""
    repo = folder.parent.parent.name  # .../models--org--name/snapshots/<sha>
    if folder.parent.name == "snapshots" and repo.startswith("models--"):
        return repo[len("models--") :].replace("--", "/")
    return folder.name


def resolve_model(
    model: str | None,
    dtype: torch.dtype,
    device: torch.device,
    progress: ProgressCallback | None,
    lora_rows: int = 0,
    quantization: Quantization | None = None,
    quant_plan: QuantPlan | None = None,
) -> BaseModel:
    """Load what ``model`` names; ValueError / FileNotFoundError with a clear message otherwise.

    ``lora_rows``: LoRA A rows per slice to reserve after each GEMM weight (``weights.py``).
    ``quantization``: what the base is served as (``quant_plan_builder.base_quantization``),
    its projections placed as ``quant_plan`` says.
    """
    if model is not None and model.startswith(RANDOM_PREFIX):
        shape = model[len(RANDOM_PREFIX) :]
        if shape not in RANDOM_SHAPES:
            raise ValueError(f"unknown random model shape {shape!r}; known: {', '.join(RANDOM_SHAPES)}")
        spec = RANDOM_SHAPES[shape]
        return BaseModel(
            model,
            spec,
            random_weights(
                spec, dtype, device, lora_rows=lora_rows, quantization=quantization, quant_plan=quant_plan
            ),
            None,
            f"random-{shape}",
            None,
        )
    identity = describe_model(model, progress)
    folder, name, digest = identity.folder, identity.name, identity.digest
    spec = load_spec(folder)
    tokenizer = load_tokenizer(folder)
    eos = set(spec.eos_token_ids)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        eos.add(int(tokenizer.eos_token_id))
    spec = dataclasses.replace(spec, eos_token_ids=tuple(sorted(eos)))
    weights = load_weights(folder, spec, dtype, device, lora_rows, quantization, quant_plan)
    return BaseModel(name, spec, weights, tokenizer, digest, folder)


def check_model_folder(folder: Path) -> None:
    """Refuse a folder the engine could not load, reading only its config and safetensors headers.

    Cheap enough to run before a working engine is stopped for the new model: config.json and an
    architecture the engine serves, weights as safetensors (one file or an index of shards), and
    headers that agree with the files' sizes. ValueError / FileNotFoundError name the problem.
    """
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"model folder {folder} does not exist")
    load_spec(folder)
    checkpoint_quantization(json.loads((folder / "config.json").read_text()))
    for path in checkpoint_files(folder):
        if not read_header(path):
            raise ValueError(f"{path} holds no tensors")
