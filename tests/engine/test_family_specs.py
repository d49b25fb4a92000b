"""config.json of each family -> ModelSpec, checked against the models transformers builds from it."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from multilora_studio.engine.model.model_source import RANDOM_SHAPES
from multilora_studio.engine.model.model_spec import spec_from_config

# the published configs' shape fields of the random shapes' models
HUB_CONFIGS = {
    "gemma2-9b": dict(
        model_type="gemma2",
        vocab_size=256000,
        hidden_size=3584,
        intermediate_size=14336,
        num_hidden_layers=42,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=256,
        rms_norm_eps=1e-6,
        max_position_embeddings=8192,
        rope_theta=10000.0,
        query_pre_attn_scalar=256,
        sliding_window=4096,
        eos_token_id=1,
    ),
    "qwen3-8b": dict(
        model_type="qwen3",
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        max_position_embeddings=40960,
        rope_theta=1000000.0,
        eos_token_id=151645,
    ),
    "llama3.2-1b": dict(
        model_type="llama",
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        max_position_embeddings=131072,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        rope_theta=500000.0,
        eos_token_id=128009,
    ),
}


@pytest.mark.parametrize("shape", list(HUB_CONFIGS))
def test_random_shapes_are_the_published_models(shape):
    """The spec read from the config equals the random shape, and its parameter count is that of
    the model transformers builds (q/k norms and a tied head included)."""
    fields = dict(HUB_CONFIGS[shape])
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    spec = spec_from_config(config.to_dict())
    shape_spec = RANDOM_SHAPES[shape]
    assert dataclasses.replace(spec, layer_windows=()) == dataclasses.replace(shape_spec, layer_windows=())
    assert [spec.window_of(i) for i in range(spec.num_layers)] == [
        shape_spec.window_of(i) for i in range(spec.num_layers)
    ]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert spec.num_parameters() == sum(p.numel() for p in model.parameters())


def test_qwen3_has_qk_norms_and_no_attention_bias_by_default():
    config = AutoConfig.for_model("qwen3", hidden_size=64, num_attention_heads=4, num_hidden_layers=1)
    spec = spec_from_config({k: v for k, v in config.to_dict().items() if k != "head_dim"})
    assert spec.qk_norm and not spec.attention_bias and spec.head_dim == 128  # transformers' default
    assert spec.layer_windows == (None,)  # use_sliding_window is off unless the config says so
    qwen2 = spec_from_config(AutoConfig.for_model("qwen2", hidden_size=64, num_attention_heads=4).to_dict())
    assert not qwen2.qk_norm and qwen2.attention_bias


@pytest.mark.parametrize(
    ("model_type", "fields", "windows"),
    [
        ("mistral", dict(sliding_window=8), (8, 8, 8, 8)),
        ("mistral", dict(sliding_window=None), (None,) * 4),
        ("phi3", dict(sliding_window=2047), (2047,) * 4),
        ("qwen2", dict(sliding_window=8), (None,) * 4),  # use_sliding_window is off by default
        ("qwen2", dict(use_sliding_window=True, sliding_window=8, max_window_layers=2), (None, None, 8, 8)),
        ("qwen3", dict(use_sliding_window=True, sliding_window=8, max_window_layers=3), (None,) * 3 + (8,)),
        ("llama", dict(sliding_window=8), (None,) * 4),  # transformers' llama has no window
    ],
)
def test_layer_windows_are_where_transformers_applies_them(model_type, fields, windows):
    """Each layer's window as the transformers model applies it (its config's layer_types)."""
    config = AutoConfig.for_model(
        model_type, hidden_size=64, num_attention_heads=4, num_hidden_layers=4, **fields
    )
    assert spec_from_config(config.to_dict()).layer_windows == windows
    types = getattr(config, "layer_types", None)
    if types is not None and model_type != "mistral":
        expected = tuple(config.sliding_window if t == "sliding_attention" else None for t in types)
        assert windows == expected


def test_partial_rotary_and_bad_layer_types_are_refused_by_name():
    phi4_mini = AutoConfig.for_model(
        "phi3", hidden_size=64, num_attention_heads=4, partial_rotary_factor=0.75
    )
    with pytest.raises(ValueError, match=r"partial_rotary_factor 0\.75"):
        spec_from_config(phi4_mini.to_dict())
    qwen2 = AutoConfig.for_model(
        "qwen2", hidden_size=64, num_attention_heads=4, num_hidden_layers=2
    ).to_dict()
    qwen2.update(use_sliding_window=True, sliding_window=8, layer_types=["sliding_attention"])
    with pytest.raises(ValueError, match="layer_types"):
        spec_from_config(qwen2)


# google/gemma-3-4b-it's config.json as the Hub stores it: few text_config fields, the older
# rope_scaling (of the global layers), sliding_window_pattern and no layer_types
GEMMA3_4B_IMAGE_TEXT = {
    "model_type": "gemma3",
    "eos_token_id": [1, 106],
    "mm_tokens_per_image": 256,
    "text_config": {
        "model_type": "gemma3_text",
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "vision_config": {"model_type": "siglip_vision_model", "image_size": 896, "patch_size": 14},
}


def test_gemma3_image_text_config_reads_as_transformers_fills_it():
    """The Hub's sparse gemma3 config gives the spec of the text model transformers builds from
    it: its defaults, layer types every 6th global, the local and the scaled global RoPE."""
    from transformers import Gemma3Config

    spec = spec_from_config(GEMMA3_4B_IMAGE_TEXT)
    text = Gemma3Config(**{k: v for k, v in GEMMA3_4B_IMAGE_TEXT.items() if k != "model_type"}).text_config
    from_text = spec_from_config(text.to_dict())
    assert from_text == dataclasses.replace(spec, eos_token_ids=from_text.eos_token_ids)
    assert spec.eos_token_ids == (1, 106)  # the image-text config's, at its top level
    assert (spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.vocab_size) == (8, 4, 256, 262_208)
    assert spec.layer_windows == tuple(None if (i + 1) % 6 == 0 else 1024 for i in range(34))
    assert (spec.rope.kind, spec.rope.factor, spec.rope.theta) == ("linear", 8.0, 1_000_000.0)
    assert spec.local_rope is not None and (spec.local_rope.kind, spec.local_rope.theta) == (
        "default",
        10_000.0,
    )
    assert spec.uses_local_rope(0) and not spec.uses_local_rope(5)
    assert spec.qk_norm and spec.gemma and spec.attn_softcap is None
    assert spec.attention_scale == 256**-0.5
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(text)
    assert spec.num_parameters() == sum(p.numel() for p in model.parameters())


def test_gemma3_refusals_name_the_field():
    with pytest.raises(ValueError, match="text_config"):
        spec_from_config({"model_type": "gemma3"})
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        spec_from_config({"model_type": "gemma3_text", "use_bidirectional_attention": True})
