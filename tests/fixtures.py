"""Builders for the tiny test model and its PEFT adapters (used by tests/conftest.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    options: tuple[tuple[str, Any], ...] = ()  # more LoraConfig fields (use_dora, lora_bias)


# adapters on phi3's fused projections (PEFT targets the checkpoint's module names)
FUSED_ADAPTERS = (
    AdapterSpec("tiny-r8-fused", 8, 16, ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"), 16),
    AdapterSpec("tiny-r4-qkv", 4, 8, ("qkv_proj",), 17),
)
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


@dataclass(frozen=True)
class TinyVariant:
    """A tiny random checkpoint of one family, stored as some Hub checkpoints are."""

    architecture: str
    config: tuple[tuple[str, object], ...] = ()  # config.json fields over the common ones
    max_shard_size: str | None = None  # sharded, with model.safetensors.index.json
    stored_dtype: torch.dtype = torch.float32  # the dtype of the tensors in the files
    tokenizer: bool = True
    lm_head_only: bool = False  # the tied matrix stored only as lm_head.weight (save_model)


LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
YARN_ROPE = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 32,
}
# Phi-3 style: short factors up to 64 positions, long ones beyond (head_dim 16: 8 factors each)
LONGROPE_ROPE = {
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "short_factor": [1.0, 1.1, 1.2, 1.5, 2.0, 3.0, 4.0, 5.0],
    "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 9.0, 12.0, 16.0],
    "original_max_position_embeddings": 64,
}

GEMMA3_CONFIG = (
    ("head_dim", 16),
    ("sliding_window", 12),
    ("sliding_window_pattern", 2),
    ("query_pre_attn_scalar", 24),
    ("final_logit_softcapping", 3.0),
    (
        "rope_parameters",
        {
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 50000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0},
        },
    ),
)
# the image-text model's vision tower, as small as Gemma 3 allows (4 image tokens)
TINY_SIGLIP = dict(
    model_type="siglip_vision_model",
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    image_size=28,
    patch_size=14,
)

FAMILY_VARIANTS = {
    "qwen2": TinyVariant("qwen2"),
    "mistral": TinyVariant("mistral"),
    "qwen3": TinyVariant("qwen3"),
    "qwen2-yarn": TinyVariant("qwen2", (("rope_parameters", YARN_ROPE), ("max_position_embeddings", 128))),
    "qwen3-yarn": TinyVariant("qwen3", (("rope_parameters", YARN_ROPE), ("max_position_embeddings", 128))),
    "llama3.2-tied": TinyVariant(
        "llama", (("rope_parameters", LLAMA3_ROPE),), stored_dtype=torch.float16, lm_head_only=True
    ),
    "llama-sharded-bf16-no-tokenizer": TinyVariant(
        "llama", max_shard_size="2MB", stored_dtype=torch.bfloat16, tokenizer=False
    ),
    # sliding windows shorter than prompt + 32 new tokens: every layer (mistral, phi3), or the
    # layers from max_window_layers on (qwen2: layer 0 full, layers 1-2 windowed)
    "mistral-window": TinyVariant("mistral", (("sliding_window", 12),)),
    "qwen2-window": TinyVariant(
        "qwen2", (("use_sliding_window", True), ("sliding_window", 12), ("max_window_layers", 1))
    ),
    "phi3": TinyVariant("phi3", (("sliding_window", 20), ("tie_word_embeddings", False))),
    # Gemma 2: layers 0 and 2 windowed, 1 global; caps small enough to bend these logits
    "gemma2": TinyVariant(
        "gemma2",
        (
            ("head_dim", 16),
            ("sliding_window", 12),
            ("query_pre_attn_scalar", 24),
            ("attn_logit_softcapping", 2.0),
            ("final_logit_softcapping", 3.0),
        ),
    ),
    # Gemma 3: q/k norms, layer 1 global and layers 0 and 2 windowed with their own RoPE; as the
    # text model, and inside the image-text model (a tiny vision tower beside it)
    "gemma3": TinyVariant("gemma3_text", GEMMA3_CONFIG),
    "gemma3-image-text": TinyVariant("gemma3", GEMMA3_CONFIG),
    # one layer: tests that run whole forward passes in Triton's interpreter and check what
    # each step kind launches (every layer launches the same kernels)
    "llama-one-layer": TinyVariant("llama", (("num_hidden_layers", 1),)),
    "llama-longrope": TinyVariant(
        "llama", (("rope_parameters", LONGROPE_ROPE), ("max_position_embeddings", 256))
    ),
    "phi3-longrope": TinyVariant(
        "phi3",
        (
            ("rope_parameters", LONGROPE_ROPE),
            ("max_position_embeddings", 256),
            ("original_max_position_embeddings", 64),
            ("tie_word_embeddings", False),
        ),
    ),
}
# the text a SentencePiece-style test tokenizer learns its pieces from
SENTENCEPIECE_TEXT = (
    "The quick brown fox jumps over the lazy dog.",
    "Hello world: the model reads the text and writes the answer.",
    "A merged model is written as one file that llama.cpp reads.",
)


def build_tiny_model(
    tokenizer_dir: Path | None, target: Path, architecture: str = "llama", variant: TinyVariant | None = None
) -> Path:
    """A random-weight model of the Llama family (a few MB) with the default tokenizer.

    ``variant`` (it overrides ``architecture``): its config fields, shards, stored dtype,
    tokenizer or not, and the tied matrix under ``lm_head.weight`` only.
    """
    import shutil

    from transformers import AutoConfig, AutoModelForCausalLM

    variant = variant or TinyVariant(architecture)
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
    if variant.architecture in ("qwen2", "qwen3"):
        common.update(use_sliding_window=False)
    if variant.architecture in ("mistral", "qwen3"):
        common.update(sliding_window=None, head_dim=16)
    common.update(dict(variant.config))
    if variant.architecture == "gemma3":  # the decoder's fields are the image-text model's text_config
        config = AutoConfig.for_model(
            "gemma3", text_config=common, vision_config=TINY_SIGLIP, mm_tokens_per_image=4
        )
    else:
        config = AutoConfig.for_model(variant.architecture, **common)
    torch.manual_seed(1234)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if variant.architecture == "qwen3":  # q/k norm weights away from ones, so that they matter
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith(("q_norm.weight", "k_norm.weight")):
                    param.uniform_(0.5, 1.5)
    if variant.architecture in ("gemma2", "gemma3_text", "gemma3"):  # norm weights w (scale 1 + w) off zero
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.uniform_(-0.5, 0.5)
    model = model.to(variant.stored_dtype)
    if variant.lm_head_only:
        from safetensors.torch import save_model

        target.mkdir(parents=True, exist_ok=True)
        config.save_pretrained(str(target))
        save_model(model, str(target / "model.safetensors"))
    else:
        shards = {"max_shard_size": variant.max_shard_size} if variant.max_shard_size else {}
        model.save_pretrained(str(target), safe_serialization=True, **shards)
    if variant.tokenizer and tokenizer_dir is not None:
        for item in tokenizer_dir.iterdir():
            shutil.copy(item, target / item.name)
    return target


def build_sentencepiece_tokenizer(target: Path) -> Path:
    """A Llama-2-style tokenizer (BPE with byte fallback, ``▁`` for spaces) of a few hundred
    tokens: ``<unk> <s> </s>``, the 256 byte tokens, pieces learned from ``SENTENCEPIECE_TEXT``
    and the merges of every split of each piece ranked by the piece's id, as a converted
    SentencePiece vocabulary has them; ``<|im_end|>`` an added special token."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaTokenizer
    from transformers.tokenization_utils_base import generate_merges

    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = pre_tokenizers.Metaspace()
    learner.train_from_iterator(SENTENCEPIECE_TEXT, trainers.BpeTrainer(vocab_size=160, show_progress=False))
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{byte:02X}>": 3 + byte for byte in range(256)}}
    for piece, _ in sorted(learner.get_vocab().items(), key=lambda item: item[1]):
        vocab.setdefault(piece, len(vocab))
    merges = generate_merges(vocab, {piece: -index for piece, index in vocab.items()})
    tokenizer = LlamaTokenizer(vocab=vocab, merges=merges, add_bos_token=True)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_end|>"]})
    tokenizer.save_pretrained(str(target))
    return target


def build_adapter(base_dir: Path, spec: AdapterSpec, target: Path, added_tokens: int = 0) -> Path:
    """A PEFT LoRA adapter with random, non-zero A and B for the model at ``base_dir``.

    Its ``modules_to_save`` copies and trainable token rows are perturbed too; ``added_tokens``
    resizes the vocabulary first (the embeddings saved with the adapter, PEFT's
    ``save_embedding_layers``).
    """
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    if added_tokens:  # a resized vocabulary: new rows, and every row changed so that it matters
        torch.manual_seed(spec.seed + 1000)
        model.resize_token_embeddings(model.config.vocab_size + added_tokens, mean_resizing=False)
        with torch.no_grad():
            matrices = [model.get_input_embeddings().weight, model.get_output_embeddings().weight]
            for weight in {id(w): w for w in matrices}.values():  # tied: one matrix
                assert isinstance(weight, torch.Tensor)
                weight.add_(torch.randn_like(weight) * 0.5 * float(weight.std()))
    config = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        target_modules=list(spec.targets),
        lora_dropout=0.0,
        init_lora_weights=False,
        task_type="CAUSAL_LM",
        **dict(spec.options),
    )
    torch.manual_seed(spec.seed)
    peft_model = get_peft_model(model, config)
    with torch.no_grad():  # every trained tensor away from its initial value, so that it matters
        for name, param in peft_model.named_parameters():
            if "lora_magnitude_vector" in name:  # DoRA: the row norms of W + B A, rescaled
                param.mul_(1 + 0.3 * torch.randn_like(param))
            elif "lora_" in name:
                param.copy_(torch.randn_like(param) * (0.3 if "lora_A" in name else 0.2))
            elif "modules_to_save" in name or "trainable_tokens_delta" in name:
                param.add_(torch.randn_like(param) * 0.5 * float(param.std()))
    peft_model.save_pretrained(str(target), safe_serialization=True, save_embedding_layers=bool(added_tokens))
    return target
