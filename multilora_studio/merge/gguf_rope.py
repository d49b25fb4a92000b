"""RoPE scaling as llama.cpp's GGUF carries it (the layout of its convert_hf_to_gguf.py):

- linear: ``rope.scaling.type`` and ``rope.scaling.factor``;
- llama3 (Llama 3.1 / 3.2, architecture ``llama``): the tensor ``rope_freqs``, per frequency the
  unscaled inverse frequency over the scaled one (llama.cpp divides each frequency by it);
- longrope (Phi-3, architecture ``phi3``): ``rope_factors_long`` / ``rope_factors_short``, with the
  original context length and the attention factor as ``rope.scaling.*``.

Other scalings (yarn, longrope or llama3 on other architectures) raise MergeError.
"""

from __future__ import annotations

import gguf
import numpy as np

from multilora_studio.engine.model.model_spec import ModelSpec, RopeSpec
from multilora_studio.engine.model.rope import attention_factor, inverse_frequencies
from multilora_studio.merge.merged_weights import MergeError

_TENSORS = gguf.TENSOR_NAMES
# the scaling each GGUF architecture reads from tensors, as llama.cpp's converter writes them
_TENSOR_SCALINGS = {("llama", "llama3"), ("phi3", "longrope")}


def add_rope_scaling(writer: gguf.GGUFWriter, spec: ModelSpec) -> dict[str, np.ndarray]:
    """Write ``spec``'s RoPE scaling keys; return the float32 tensors that carry the rest
    (``{"rope_freqs.weight": ...}``), or MergeError where llama.cpp defines no form for it."""
    rope = spec.rope
    if rope.kind == "default":
        return {}
    if rope.kind == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope.factor)
        return {}
    if (writer.arch, rope.kind) not in _TENSOR_SCALINGS:
        raise MergeError(
            f"RoPE scaling {rope.kind!r} is not written to GGUF for {writer.arch} here (llama3 for llama, "
            "longrope for phi3); convert the merged folder with llama.cpp's convert_hf_to_gguf.py"
        )
    if rope.kind == "llama3":
        return {_TENSORS[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight": llama3_factors(rope, spec.head_dim)}
    if not len(rope.long_factor) == len(rope.short_factor) == spec.head_dim // 2:
        raise MergeError(f"longrope needs {spec.head_dim // 2} long and short factors for GGUF")
    writer.add_rope_scaling_orig_ctx_len(rope.original_max_position)
    writer.add_rope_scaling_attn_factors(attention_factor(rope))
    return {
        _TENSORS[gguf.MODEL_TENSOR.ROPE_FACTORS_LONG] + ".weight": np.array(rope.long_factor, np.float32),
        _TENSORS[gguf.MODEL_TENSOR.ROPE_FACTORS_SHORT] + ".weight": np.array(rope.short_factor, np.float32),
    }


def llama3_factors(rope: RopeSpec, head_dim: int) -> np.ndarray:
    """[head_dim // 2] float32: each unscaled inverse frequency over its llama3-scaled one."""
    unscaled = inverse_frequencies(RopeSpec(theta=rope.theta), head_dim)
    return (unscaled / inverse_frequencies(rope, head_dim)).numpy()
