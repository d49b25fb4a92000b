"""Forward pass of the Llama family (llama, mistral, qwen2) over a paged KV cache.

Plain functions over the fused weights: per layer one qkv GEMM, one gate_up GEMM,
and the LoRA term of each targeted projection group added by the multi-LoRA
kernels for a per-token adapter slot. Per-step metadata arrives as arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from multilora_studio.engine.lora_weights import LoRASlotWeights
from multilora_studio.engine.model_spec import ModelSpec
from multilora_studio.engine.rope import cos_sin_cache
from multilora_studio.engine.weights import ModelWeights
from multilora_studio.kernels.cpu_linear import packed_linear
from multilora_studio.kernels.fused_ops import add_rms_norm, rms_norm, rope_, silu_and_mul
from multilora_studio.kernels.lora import LoRABatch, add_lora
from multilora_studio.kernels.paged_attention import paged_attention, write_kv


@dataclass
class AttentionMetadata:
    """Where this step's tokens go in the paged cache and what each attends to."""

    slot_mapping: torch.Tensor  # [T] int64, flat cache slot per token, -1 = padding
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor  # [num_seqs] int32, context incl. this step
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    max_query_len: int


@dataclass
class LoRAStep:
    """The adapters of this step: per-token slots and which projection groups any of them targets."""

    batch: LoRABatch
    groups: frozenset[str]


class LlamaModel:
    """One base model on one device, with optional LoRA slot weights."""

    def __init__(
        self,
        spec: ModelSpec,
        weights: ModelWeights,
        lora: LoRASlotWeights | None,
        max_positions: int,
    ) -> None:
        self.spec = spec
        self.weights = weights
        self.lora = lora
        device = weights.embed.device
        self.rope = cos_sin_cache(spec.rope, spec.head_dim, max_positions, device)  # [P, D]
        self.scale = spec.head_dim**-0.5
        self.linear = packed_linear if weights.onednn_packed else F.linear

    def _add_lora(
        self, group: str, layer: int, y: torch.Tensor, x: torch.Tensor, step: LoRAStep | None
    ) -> None:
        if step is None or group not in step.groups or self.lora is None:
            return
        lora = self.lora
        # The slot buffers and activations are consistent by construction: no argument checks.
        add_lora(
            y, x, lora.a[group][layer], lora.b[group][layer], step.batch, lora.offsets[group], validate=False
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        lora: LoRAStep | None,
    ) -> torch.Tensor:
        """Hidden states [T, H] after the final norm, for ``input_ids`` [T] at ``positions`` [T]."""
        spec = self.spec
        q_size, kv_size, eps = spec.q_size, spec.kv_size, spec.rms_norm_eps
        tokens = input_ids.shape[0]
        layers = self.weights.layers
        residual = F.embedding(input_ids, self.weights.embed)  # [T, H], the residual stream
        h = rms_norm(residual, layers[0].input_norm, eps)
        for index, layer in enumerate(layers):
            qkv = self.linear(h, layer.qkv, layer.qkv_bias)  # [T, q + 2 kv]
            self._add_lora("qkv", index, qkv, h, lora)
            q = qkv[:, :q_size].view(tokens, spec.num_heads, spec.head_dim)
            k = qkv[:, q_size : q_size + kv_size].view(tokens, spec.num_kv_heads, spec.head_dim)
            v = qkv[:, q_size + kv_size :].view(tokens, spec.num_kv_heads, spec.head_dim)
            rope_(q, self.rope, positions)
            rope_(k, self.rope, positions)
            k_cache, v_cache = kv_caches[index]
            write_kv(k, v, k_cache, v_cache, attn.slot_mapping)
            context = paged_attention(
                q,
                k_cache,
                v_cache,
                attn.block_tables,
                attn.seq_lens,
                attn.query_start_loc,
                self.scale,
                max_query_len=attn.max_query_len,
            ).view(tokens, q_size)  # [T, q]
            o = self.linear(context, layer.o)  # [T, H]
            self._add_lora("o", index, o, context, lora)
            h = add_rms_norm(o, residual, layer.post_norm, eps)  # residual += o
            gate_up = self.linear(h, layer.gate_up)  # [T, 2 I]
            self._add_lora("gate_up", index, gate_up, h, lora)
            act = silu_and_mul(gate_up)  # [T, I]
            down = self.linear(act, layer.down)  # [T, H]
            self._add_lora("down", index, down, act, lora)
            next_norm = layers[index + 1].input_norm if index + 1 < len(layers) else self.weights.final_norm
            h = add_rms_norm(down, residual, next_norm, eps)  # residual += down
        return h

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, V] float32 logits of the given hidden rows."""
        return self.linear(hidden, self.weights.lm_head).float()
