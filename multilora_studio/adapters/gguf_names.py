"""llama.cpp's GGUF layout of the families the engine serves: the GGUF architecture of each
``model_type``, the name of each LoRA-targetable projection (from the ``gguf`` package's tensor
name map, the one llama.cpp's converters use) and the row order of the projections llama.cpp
stores differently from Hugging Face.

llama.cpp's converter writes Llama and Mistral checkpoints as architecture ``llama`` with the
rows of q_proj and k_proj permuted (its rotary embedding pairs neighbouring dimensions, Hugging
Face's pairs the two halves of a head); a LoRA B of those projections is permuted the same way.
Phi-3 keeps its fused projections (``attn_qkv``, ``ffn_up`` holding gate and up).
"""

from __future__ import annotations

from functools import lru_cache

import gguf
import torch

from multilora_studio.adapters.adapter_config import FUSED_TARGETS

# model_type -> GGUF general.architecture, as llama.cpp's converter writes it
GGUF_ARCHITECTURES = {
    "llama": gguf.MODEL_ARCH.LLAMA,
    "mistral": gguf.MODEL_ARCH.LLAMA,
    "qwen2": gguf.MODEL_ARCH.QWEN2,
    "qwen3": gguf.MODEL_ARCH.QWEN3,
    "phi3": gguf.MODEL_ARCH.PHI3,
    "gemma2": gguf.MODEL_ARCH.GEMMA2,
    "gemma3_text": gguf.MODEL_ARCH.GEMMA3,
}
PERMUTED_ROPE = ("llama", "mistral")  # q_proj / k_proj rows permuted in the GGUF file
# the GGUF tensors of a family's projections, and the projections each holds (in row order)
FUSED_IN_GGUF = {"phi3": FUSED_TARGETS}
_BLOCKS = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "qkv_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
    "gate_up_proj": "mlp",
}


class GGUFFamilyError(ValueError):
    """The base model's family has no GGUF layout that llama.cpp defines."""


def gguf_architecture(model_type: str) -> str:
    """The GGUF ``general.architecture`` of a ``model_type``; GGUFFamilyError for others."""
    arch = GGUF_ARCHITECTURES.get(model_type)
    if arch is None:
        served = ", ".join(sorted({gguf.MODEL_ARCH_NAMES[a] for a in GGUF_ARCHITECTURES.values()}))
        raise GGUFFamilyError(
            f"model_type {model_type!r} has no llama.cpp GGUF layout here; GGUF covers {served}"
        )
    return gguf.MODEL_ARCH_NAMES[arch]


def hf_module_path(layer: int, module: str) -> str:
    """The Hugging Face path of a projection of layer ``layer`` (``model.layers.N.self_attn.q_proj``)."""
    return f"model.layers.{layer}.{_BLOCKS[module]}.{module}"


def gguf_modules(model_type: str) -> tuple[str, ...]:
    """The projections a family's GGUF file has a tensor for (the fused ones for phi3)."""
    fused = FUSED_IN_GGUF.get(model_type, {})
    inside = {part for parts in fused.values() for part in parts}
    return tuple(m for m in _BLOCKS if m not in inside and (m in fused or m not in FUSED_TARGETS))


@lru_cache(maxsize=64)
def gguf_tensor_names(model_type: str, num_layers: int) -> dict[tuple[int, str], str]:
    """``{(layer, projection): "blk.N.attn_q.weight"}`` for every projection the family's GGUF
    file holds, from the ``gguf`` package's tensor name map."""
    gguf_architecture(model_type)  # GGUFFamilyError for a family llama.cpp has no layout of here
    name_map = gguf.get_tensor_name_map(GGUF_ARCHITECTURES[model_type], num_layers)
    names = {}
    for layer in range(num_layers):
        for module in gguf_modules(model_type):
            found = name_map.get_name(hf_module_path(layer, module))
            if found is not None:
                names[(layer, module)] = found + ".weight"
    return names


def permute_rows(rows: torch.Tensor, heads: int) -> torch.Tensor:
    """Hugging Face's row order of a q/k projection -> llama.cpp's: within each head, the rows
    of the two rotary halves interleaved. ``rows`` [heads * head_dim, ...]."""
    return (
        rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:])
        .swapaxes(1, 2)
        .reshape(rows.shape)
    )


def unpermute_rows(rows: torch.Tensor, heads: int) -> torch.Tensor:
    """The inverse of ``permute_rows``."""
    return (
        rows.reshape(heads, rows.shape[0] // heads // 2, 2, *rows.shape[1:])
        .swapaxes(1, 2)
        .reshape(rows.shape)
    )
