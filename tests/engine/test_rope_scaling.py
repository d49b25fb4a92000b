"""RoPE scaling (linear, llama3, yarn, longrope): inverse frequencies and attention factors equal
transformers' ``ROPE_INIT_FUNCTIONS`` for the same config.json."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from multilora_studio.engine.model.model_spec import spec_from_config
from multilora_studio.engine.model.rope import attention_factor, cos_sin_cache, inverse_frequencies, rope_rows

SHORT = [1.0 + 0.1 * i for i in range(64)]
LONG = [1.0 + 0.5 * i for i in range(64)]
CONFIGS = {
    # Qwen2.5 long context, as its config.json writes it (rope_scaling, top-level rope_theta)
    "qwen2-yarn": dict(
        model_type="qwen2",
        rope_theta=1000000.0,
        max_position_embeddings=131072,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    ),
    "qwen3-yarn": dict(
        model_type="qwen3",
        head_dim=128,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 1000000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 32768,
        },
    ),
    "yarn-mscale-no-truncate": dict(
        model_type="llama",
        max_position_embeddings=16384,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "mscale": 1.0,
            "mscale_all_dim": 0.707,
            "beta_fast": 16,
            "beta_slow": 2,
            "truncate": False,
            "original_max_position_embeddings": 2048,
        },
    ),
    "yarn-attention-factor": dict(
        model_type="llama",
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 2.0,
            "attention_factor": 0.8,
            "original_max_position_embeddings": 1024,
        },
    ),
    # Phi-3 128k: original_max_position_embeddings at the top level, factor from the ratio
    "phi3-longrope": dict(
        model_type="llama",
        max_position_embeddings=131072,
        original_max_position_embeddings=4096,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": SHORT,
            "long_factor": LONG,
        },
    ),
    "llama3": dict(
        model_type="llama",
        max_position_embeddings=131072,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    "linear": dict(
        model_type="llama", rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}
    ),
}


def hf_config(fields: dict):
    fields = dict(fields)
    model_type = fields.pop("model_type")
    shape = dict(hidden_size=1024, num_attention_heads=8, num_key_value_heads=2, intermediate_size=64)
    return AutoConfig.for_model(model_type, **shape, **fields)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_inverse_frequencies_and_attention_factor_equal_transformers(name):
    config = hf_config(CONFIGS[name])
    spec = spec_from_config(config.to_dict())
    kind = config.rope_parameters["rope_type"]
    assert spec.rope.kind == kind
    hf_inv, hf_factor = ROPE_INIT_FUNCTIONS[kind](config, torch.device("cpu"))
    assert torch.equal(inverse_frequencies(spec.rope, spec.head_dim), hf_inv.float())
    assert attention_factor(spec.rope) == pytest.approx(hf_factor, rel=1e-12)
    if kind == "longrope":  # the long factors past the original length
        original = spec.rope.original_max_position
        hf_long, hf_long_factor = ROPE_INIT_FUNCTIONS[kind](config, torch.device("cpu"), seq_len=original + 1)
        assert not torch.equal(hf_long, hf_inv)
        assert torch.equal(inverse_frequencies(spec.rope, spec.head_dim, long=True), hf_long.float())
        assert attention_factor(spec.rope) == pytest.approx(hf_long_factor, rel=1e-12)
    if kind in ("yarn", "longrope") and "attention_factor" not in config.rope_parameters:
        assert attention_factor(spec.rope) != 1.0  # the scaling these configs imply is applied


def test_cos_sin_carry_the_attention_factor_and_longrope_picks_rows_by_sequence_length():
    config = hf_config(CONFIGS["phi3-longrope"])
    rope = spec_from_config(config.to_dict()).rope
    positions = 8
    table = cos_sin_cache(rope, 128, positions, torch.device("cpu"))  # [2P, D]
    assert table.shape == (2 * positions, 128)
    cos, sin = table[:, :64], table[:, 64:]
    torch.testing.assert_close(cos**2 + sin**2, torch.full_like(cos, attention_factor(rope) ** 2))
    # two sequences: 3 tokens of one at the original length, 2 of one past it
    original = rope.original_max_position
    seq_lens = torch.tensor([original, original + 1], dtype=torch.int32)
    starts = torch.tensor([0, 3, 5], dtype=torch.int32)
    at = torch.tensor([1, 2, 3, 4, 5])
    assert rope_rows(rope, at, seq_lens, starts, positions).tolist() == [
        1,
        2,
        3,
        4 + positions,
        5 + positions,
    ]
