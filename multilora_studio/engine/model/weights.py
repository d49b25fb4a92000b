"""Base weights of a Llama-family checkpoint, loaded from HF safetensors into fused tensors.

Fused projections (qkv, gate_up) are filled from their HF parts by a data table
(``PACKED_MODULES``), each part copied straight from the memory-mapped file into
its rows of the fused tensor.

For the shrink in GEMM (``LoRAPlan.shrink_in_gemm``), ``lora_rows`` > 0: each GEMM group's
weights of all layers live in one tensor ``[layers, N + slices * lora_rows, K]``
(``shrink_in_gemm_weights``): the layer's weight is the view of its first N rows, and the
rows after them hold the LoRA A factors of every slot (zeros until an adapter is uploaded,
``LoRASlotWeights``), so one GEMM over the whole row range gives the base output and every
slot's shrink. qkv's bias gets the same extra (zero) entries.

A quantized base (``quantization``: a quantized checkpoint, or a float one quantized at load)
holds its projections (qkv, o, gate_up, down) as ``QuantizedWeight`` objects
(``engine/model/quant_loading.py``), or dense again where the ``QuantPlan`` dequantizes at load (the
CPU); embeddings, norms and the LM head stay float. It never has shrink-in-GEMM rows: LoRA A
rows cannot be appended to packed weights.

A mixture-of-experts layer (``ModelSpec.moe``) holds its router and experts
(``ExpertWeights``, ``engine/model/moe_weights.py``) instead of gate_up and down; its base has
shrink-in-GEMM rows for the attention groups only (``ModelSpec.lora_groups``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from multilora_studio.checkpoint_files import checkpoint_files
from multilora_studio.engine.model.model_spec import ModelSpec
from multilora_studio.engine.model.moe_weights import (
    ExpertWeights,
    load_expert_weights,
    random_expert_weights,
)
from multilora_studio.engine.model.quant_loading import QUANTIZED_DTYPES, place_projection, stored_projection
from multilora_studio.engine.model.quantization import Quantization
from multilora_studio.kernels.cpu_linear import pack_weight
from multilora_studio.kernels.quant_linear import QuantPlan
from multilora_studio.kernels.quant_weight import Weight

# fused name -> its HF parts in row order (phi3 checkpoints store the fused tensor itself)
PACKED_MODULES = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}
PLAIN_MODULES = ("self_attn.o_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm")
# GEMM group (a LayerWeights field) -> how many LoRA slices its extra rows hold per slot
GEMM_SLICES = {"qkv": 3, "o": 1, "gate_up": 2, "down": 1}


def gemm_shape(spec: ModelSpec, group: str) -> tuple[int, int]:
    """(N, K) of a layer's base weight of ``group``."""
    hidden, inter, q, kv = spec.hidden_size, spec.intermediate_size, spec.q_size, spec.kv_size
    return {
        "qkv": (q + 2 * kv, hidden),
        "o": (hidden, q),
        "gate_up": (2 * inter, hidden),
        "down": (hidden, inter),
    }[group]


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [H]
    qkv: Weight  # [q + 2 kv, H] (a QuantizedWeight standing for it in a quantized base)
    qkv_bias: torch.Tensor | None  # [q + 2 kv]
    o: Weight  # [H, q]
    post_norm: torch.Tensor  # [H]
    gate_up: Weight | None  # [2 I, H] (None in a mixture-of-experts layer)
    down: Weight | None  # [H, I]
    q_norm: torch.Tensor | None = None  # [D], RMSNorm of each q head (qwen3)
    k_norm: torch.Tensor | None = None  # [D], of each k head
    # the Gemma block: RMSNorm of the attention / MLP output before its residual add ([H])
    attn_out_norm: torch.Tensor | None = None
    mlp_out_norm: torch.Tensor | None = None
    experts: ExpertWeights | None = None  # a mixture-of-experts layer's router and experts


@dataclass
class ModelWeights:
    embed: torch.Tensor  # [V, H]
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # [H]
    lm_head: torch.Tensor  # [V, H] (the embedding itself when tied)
    onednn_packed: bool = False  # GEMM weights in oneDNN's blocked layout (CPU): read by packed_linear only
    # group -> [layers, N + slices * lora_rows, K]: base rows then every slot's A, for the
    # shrink in GEMM (empty without lora_rows)
    shrink_in_gemm_weights: dict[str, torch.Tensor] = field(default_factory=dict)
    shrink_in_gemm_qkv_bias: torch.Tensor | None = None  # [layers, N + 3 * lora_rows], zeros after N
    quantization: Quantization | None = None  # how the projections were quantized (None: float)


def pack_for_onednn(weights: ModelWeights) -> None:
    """Reorder every GEMM weight (qkv, o, gate_up, down, lm_head) into oneDNN's layout, in place.

    The embedding stays row-major for lookups; a tied lm_head gets its own packed copy.
    """
    for layer in weights.layers:
        for group in GEMM_SLICES:
            weight = getattr(layer, group)
            if isinstance(weight, torch.Tensor):  # a quantized one keeps its own layout
                setattr(layer, group, pack_weight(weight))
    weights.lm_head = pack_weight(weights.lm_head)
    weights.onednn_packed = True
    weights.shrink_in_gemm_weights = {}  # the layers no longer read them
    weights.shrink_in_gemm_qkv_bias = None


def allocate_shrink_in_gemm_weights(
    spec: ModelSpec, lora_rows: int, dtype: torch.dtype, device: torch.device
) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """GEMM weights of the groups that take LoRA with ``lora_rows`` zero rows per slice after each
    layer's base rows, and qkv's bias to match (none for 0)."""
    if lora_rows <= 0:
        return {}, None
    layers = spec.num_layers
    weights = {}
    for group in spec.lora_groups:
        slices = GEMM_SLICES[group]
        n, k = gemm_shape(spec, group)
        weights[group] = torch.empty((layers, n + slices * lora_rows, k), dtype=dtype, device=device)
        weights[group][:, n:].zero_()
    bias = None
    if spec.attention_bias:
        n = gemm_shape(spec, "qkv")[0]
        bias = torch.zeros((layers, n + GEMM_SLICES["qkv"] * lora_rows), dtype=dtype, device=device)
    return weights, bias


def base_rows(
    shrink_in_gemm: dict[str, torch.Tensor], spec: ModelSpec, group: str, layer: int
) -> torch.Tensor | None:
    """A layer's base weight of ``group`` in the shrink-in-GEMM weights: the view of its base
    rows (None without them)."""
    return shrink_in_gemm[group][layer, : gemm_shape(spec, group)[0]] if group in shrink_in_gemm else None


class TensorSource:
    """Name -> tensor over all shards, memory-mapped."""

    def __init__(self, files: list[Path]) -> None:
        self._handles = [safe_open(str(path), framework="pt") for path in files]
        self._where = {name: handle for handle in self._handles for name in handle.keys()}  # noqa: SIM118

    def has(self, name: str) -> bool:
        return name in self._where

    def raw(self, name: str) -> torch.Tensor:
        """The tensor as stored (quantized data included)."""
        if name not in self._where:
            raise ValueError(f"checkpoint lacks tensor {name!r}, which config.json's architecture needs")
        return self._where[name].get_tensor(name)

    def is_fp8(self, name: str) -> bool:
        """Whether ``name`` is stored as float8 e4m3 (read from the header, not the data)."""
        return bool(self._where[name].get_slice(name).get_dtype() == "F8_E4M3")

    def get(self, name: str) -> torch.Tensor:
        """A float tensor; ValueError for one stored quantized (never read as if it were float)."""
        tensor = self.raw(name)
        if tensor.dtype in QUANTIZED_DTYPES:
            raise ValueError(
                f"{name} is stored quantized ({tensor.dtype}); only the layers' projections are served "
                "quantized (embeddings, norms and the LM head must be float)"
            )
        return tensor


# Where a checkpoint keeps its text decoder: a causal LM, or gemma3's image-text model as
# transformers saves it now and as the Hub's first uploads store it
DECODER_PREFIXES = (("model", ""), ("model.language_model", ""), ("language_model.model", "language_model."))


def decoder_prefix(has: Callable[[str], bool]) -> tuple[str, str]:
    """(prefix of the decoder's tensors, prefix of ``lm_head.weight``) in a checkpoint whose
    tensor names ``has`` tells."""
    for decoder, head in DECODER_PREFIXES:
        if has(f"{decoder}.embed_tokens.weight") or has(f"{decoder}.layers.0.input_layernorm.weight"):
            return decoder, head
    return DECODER_PREFIXES[0]


def load_weights(
    folder: Path,
    spec: ModelSpec,
    dtype: torch.dtype,
    device: torch.device,
    lora_rows: int = 0,
    quantization: Quantization | None = None,
    quant_plan: QuantPlan | None = None,
) -> ModelWeights:
    """Read the checkpoint at ``folder`` into fused tensors on ``device``.

    ``lora_rows`` (slots x max rank): reserve that many rows per LoRA slice after each GEMM
    weight (module docstring). ``quantization``: the base's (a quantized checkpoint's, or one to
    apply at load), its projections placed as ``quant_plan`` says.
    """
    if quantization is not None and lora_rows:
        raise ValueError(
            "a quantized base cannot hold shrink-in-GEMM rows (LoRA A rows after packed weights)"
        )
    if quantization is not None and spec.moe is not None:
        raise ValueError(f"a quantized {spec.model_type} (mixture-of-experts) base is not served yet")
    plan = quant_plan or QuantPlan()
    source = TensorSource(checkpoint_files(Path(folder)))
    decoder, head_prefix = decoder_prefix(source.has)
    shrink_in_gemm, shrink_in_gemm_bias = allocate_shrink_in_gemm_weights(spec, lora_rows, dtype, device)

    def norm(name: str, size: int) -> torch.Tensor:
        """An RMSNorm weight as the engine applies it (Gemma stores w for a scale of 1 + w)."""
        weight = source.get(name)
        if tuple(weight.shape) != (size,):
            raise ValueError(f"{name} has shape {tuple(weight.shape)}, config.json implies {(size,)}")
        offset = 1.0 if spec.gemma else 0.0
        return (weight.float() + offset).to(device=device, dtype=dtype)

    def take(name: str, shape: tuple[int, ...], into: torch.Tensor | None = None) -> torch.Tensor:
        tensor = source.get(name)
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, config.json implies {shape}")
        if into is not None:
            return into.copy_(tensor)
        return tensor.to(device=device, dtype=dtype)

    def projection(
        modules: list[str], shape: tuple[int, int], float_weight: Callable[[], torch.Tensor]
    ) -> Weight:
        """A projection's weight: stored quantized, or read as float (and quantized at load)."""
        stored = stored_projection(source, modules, quantization)
        if stored is not None and tuple(stored.shape) != shape:
            raise ValueError(f"{modules[0]} has shape {tuple(stored.shape)}, config.json implies {shape}")
        weight = stored if stored is not None else float_weight()
        return place_projection(weight, quantization, plan, dtype, device)

    def fused_modules(prefix: str, fused_name: str) -> list[str]:
        stored_fused = f"{prefix}.{fused_name}"
        if source.has(f"{stored_fused}.weight") or source.has(f"{stored_fused}.qweight"):
            return [stored_fused]
        return [f"{prefix}.{part}" for part in PACKED_MODULES[fused_name]]

    def fused(
        prefix: str, fused_name: str, suffix: str = "weight", into: torch.Tensor | None = None
    ) -> torch.Tensor:
        names = [f"{module}.{suffix}" for module in fused_modules(prefix, fused_name)]
        pieces = [source.get(name) for name in names]
        rows = sum(piece.shape[0] for piece in pieces)
        if into is not None and tuple(into.shape) != (rows, *pieces[0].shape[1:]):
            raise ValueError(f"{prefix}: fused projection shapes do not match config.json")
        out = (
            into
            if into is not None
            else torch.empty((rows, *pieces[0].shape[1:]), dtype=dtype, device=device)
        )
        row = 0
        for piece in pieces:
            out[row : row + piece.shape[0]].copy_(piece)
            row += piece.shape[0]
        return out

    hidden, inter = spec.hidden_size, spec.intermediate_size
    qkv_rows = spec.q_size + 2 * spec.kv_size
    layers = []
    for index in range(spec.num_layers):
        prefix = f"{decoder}.layers.{index}"

        def into(group: str, index: int = index) -> torch.Tensor | None:
            return base_rows(shrink_in_gemm, spec, group, index)

        qkv = projection(
            fused_modules(prefix, "self_attn.qkv_proj"),
            (qkv_rows, hidden),
            functools.partial(fused, prefix, "self_attn.qkv_proj", into=into("qkv")),
        )
        sparse = spec.is_sparse(index)
        gate_up = (
            None
            if sparse
            else projection(
                fused_modules(prefix, "mlp.gate_up_proj"),
                (2 * inter, hidden),
                functools.partial(fused, prefix, "mlp.gate_up_proj", into=into("gate_up")),
            )
        )
        if tuple(qkv.shape) != (qkv_rows, hidden) or (
            gate_up is not None and tuple(gate_up.shape) != (2 * inter, hidden)
        ):
            raise ValueError(f"layer {index}: fused projection shapes do not match config.json")
        bias_into = shrink_in_gemm_bias[index, :qkv_rows] if shrink_in_gemm_bias is not None else None
        # the norm before the MLP: post_attention_layernorm, or Gemma's pre_feedforward_layernorm
        # (its post_attention_layernorm norms the attention output)
        mlp_norm = "pre_feedforward_layernorm" if spec.gemma else "post_attention_layernorm"
        layers.append(
            LayerWeights(
                input_norm=norm(f"{prefix}.input_layernorm.weight", hidden),
                qkv=qkv,
                qkv_bias=fused(prefix, "self_attn.qkv_proj", "bias", into=bias_into)
                if spec.attention_bias
                else None,
                o=projection(
                    [f"{prefix}.self_attn.o_proj"],
                    (hidden, spec.q_size),
                    functools.partial(
                        take, f"{prefix}.self_attn.o_proj.weight", (hidden, spec.q_size), into("o")
                    ),
                ),
                post_norm=norm(f"{prefix}.{mlp_norm}.weight", hidden),
                gate_up=gate_up,
                down=None
                if sparse
                else projection(
                    [f"{prefix}.mlp.down_proj"],
                    (hidden, inter),
                    functools.partial(take, f"{prefix}.mlp.down_proj.weight", (hidden, inter), into("down")),
                ),
                q_norm=norm(f"{prefix}.self_attn.q_norm.weight", spec.head_dim) if spec.qk_norm else None,
                k_norm=norm(f"{prefix}.self_attn.k_norm.weight", spec.head_dim) if spec.qk_norm else None,
                attn_out_norm=norm(f"{prefix}.post_attention_layernorm.weight", hidden)
                if spec.gemma
                else None,
                mlp_out_norm=norm(f"{prefix}.post_feedforward_layernorm.weight", hidden)
                if spec.gemma
                else None,
                experts=load_expert_weights(source.has, source.get, prefix, spec, dtype, device)
                if sparse
                else None,
            )
        )
    embed_name, head_name = f"{decoder}.embed_tokens.weight", f"{head_prefix}lm_head.weight"
    # tied: the shared matrix under either name (save_model may keep only lm_head.weight)
    if spec.tie_word_embeddings and not source.has(embed_name) and source.has(head_name):
        embed_name = head_name
    embed = take(embed_name, (spec.vocab_size, hidden))
    if spec.tie_word_embeddings or not source.has(head_name):
        lm_head = embed
    else:
        lm_head = take(head_name, (spec.vocab_size, hidden))
    return ModelWeights(
        embed,
        layers,
        norm(f"{decoder}.norm.weight", hidden),
        lm_head,
        False,
        shrink_in_gemm,
        shrink_in_gemm_bias,
        quantization,
    )


def random_weights(
    spec: ModelSpec,
    dtype: torch.dtype,
    device: torch.device,
    seed: int = 0,
    lora_rows: int = 0,
    quantization: Quantization | None = None,
    quant_plan: QuantPlan | None = None,
) -> ModelWeights:
    """Random weights of the right shapes (benchmarks of large shapes without a download);
    ``quantization``: the projections quantized at load as the plan places them."""
    if quantization is not None and lora_rows:
        raise ValueError(
            "a quantized base cannot hold shrink-in-GEMM rows (LoRA A rows after packed weights)"
        )
    if quantization is not None and spec.moe is not None:
        raise ValueError(f"a quantized {spec.model_type} (mixture-of-experts) base is not served yet")
    plan = quant_plan or QuantPlan()
    generator = torch.Generator(device=device).manual_seed(seed)
    std = spec.hidden_size**-0.5
    shrink_in_gemm, shrink_in_gemm_bias = allocate_shrink_in_gemm_weights(spec, lora_rows, dtype, device)

    def rand(*shape: int, into: torch.Tensor | None = None) -> torch.Tensor:
        values = torch.randn(shape, generator=generator, device=device, dtype=torch.float32) * std
        return into.copy_(values) if into is not None else values.to(dtype)

    def gemm(group: str, layer: int) -> Weight:
        weight = rand(*gemm_shape(spec, group), into=base_rows(shrink_in_gemm, spec, group, layer))
        return place_projection(weight, quantization, plan, dtype, device)

    def ones(size: int) -> torch.Tensor:
        return torch.ones(size, device=device, dtype=dtype)

    hidden = spec.hidden_size
    qkv_rows = spec.q_size + 2 * spec.kv_size
    layers = [
        LayerWeights(
            input_norm=ones(hidden),
            qkv=gemm("qkv", index),
            qkv_bias=rand(
                qkv_rows,
                into=shrink_in_gemm_bias[index, :qkv_rows] if shrink_in_gemm_bias is not None else None,
            )
            if spec.attention_bias
            else None,
            o=gemm("o", index),
            post_norm=ones(hidden),
            gate_up=None if spec.is_sparse(index) else gemm("gate_up", index),
            down=None if spec.is_sparse(index) else gemm("down", index),
            q_norm=ones(spec.head_dim) if spec.qk_norm else None,
            k_norm=ones(spec.head_dim) if spec.qk_norm else None,
            attn_out_norm=ones(hidden) if spec.gemma else None,
            mlp_out_norm=ones(hidden) if spec.gemma else None,
            experts=random_expert_weights(spec, rand) if spec.is_sparse(index) else None,
        )
        for index in range(spec.num_layers)
    ]
    embed = rand(spec.vocab_size, hidden)
    lm_head = embed if spec.tie_word_embeddings else rand(spec.vocab_size, hidden)
    return ModelWeights(
        embed, layers, ones(hidden), lm_head, False, shrink_in_gemm, shrink_in_gemm_bias, quantization
    )
