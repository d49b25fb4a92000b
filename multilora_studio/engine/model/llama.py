"""Forward pass of the Llama family (llama, mistral, qwen2, qwen3, phi3, gemma2, gemma3, and the
mixture-of-experts qwen3_moe and mixtral) over paged KV.

Plain functions over the fused weights: per layer one qkv GEMM, one gate_up GEMM,
and the LoRA term of each targeted projection group added by the multi-LoRA
kernels for a per-token adapter slot. Per-step metadata arrives as arguments.

How the LoRA term runs is the engine's :class:`LoRAPlan`, read here and handed to every
LoRA wrapper. With the shrink in GEMM (``LoRAPlan.shrink_in_gemm``), a step of up to
``LoRAPlan.bgmv_max_tokens`` tokens runs each targeted projection as one GEMM over the base
rows and every slot's A rows, then the expand that reads each token's own slot: inside
SiLU-and-mul for gate/up (``kernels/lora_silu.py``) and inside the residual-add + RMSNorm
that follows o and down (``kernels/lora_norm.py``) where the plan folds expands (not in the
Gemma block, whose o and down outputs are normed before the add, nor with GELU); with
``LoRAPlan.fused_qkv`` q/k/v's is part of one kernel with RoPE and the K/V cache write
(``kernels/qkv_epilogue.py``).

A mixture-of-experts layer runs its MLP as ``engine/model/moe.py`` does (a torch path, no LoRA).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from multilora_studio.engine.model.lora_weights import LoRASlotWeights
from multilora_studio.engine.model.model_spec import ModelSpec
from multilora_studio.engine.model.moe import moe_mlp
from multilora_studio.engine.model.rope import cos_sin_cache, rope_rows
from multilora_studio.engine.model.token_tables import VocabRows, embed_tokens, logits_with_tables
from multilora_studio.engine.model.weights import GEMM_SLICES, ModelWeights
from multilora_studio.kernels.cpu_linear import packed_linear
from multilora_studio.kernels.fused_ops import (
    add_rms_norm,
    gelu_tanh_and_mul,
    norm_add_rms_norm,
    rms_norm,
    silu_and_mul,
)
from multilora_studio.kernels.lora import (
    LoRABatch,
    LoRAPlan,
    add_lora,
    add_rms_norm_lora,
    lora_expand_shrunk_in_gemm,
    qkv_rope_write,
    silu_and_mul_lora,
)
from multilora_studio.kernels.lora_rows import RowTerms, apply_row_terms
from multilora_studio.kernels.paged_attention import paged_attention
from multilora_studio.kernels.quant_linear import QuantPlan, quant_linear
from multilora_studio.kernels.quant_weight import QuantizedWeight, Weight
from multilora_studio.kernels.row_tiles import Linear, row_tiled


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
    """The adapters of this step: per-token slots and which projection groups any of them targets.

    ``row_groups``: the groups some adapter of the step scales or shifts per output row (DoRA,
    lora_bias): their projections add each token's row of ``LoRASlotWeights.row_scale`` /
    ``row_bias`` (``kernels.lora_rows``). ``slot_span``: with the shrink in the GEMM, only the
    A rows of slots below it are multiplied (every token's slot is below it; 0: every slot).
    """

    batch: LoRABatch
    groups: frozenset[str]
    row_groups: frozenset[str] = frozenset()
    slot_span: int = 0


class LlamaModel:
    """One base model on one device, with optional LoRA slot weights, run as ``plan`` says."""

    def __init__(
        self,
        spec: ModelSpec,
        weights: ModelWeights,
        lora: LoRASlotWeights | None,
        max_positions: int,
        plan: LoRAPlan,
        quant_plan: QuantPlan | None = None,
    ) -> None:
        if plan.shrink_in_gemm and (lora is None or not lora.shrink_in_gemm_weights):
            raise ValueError("a plan with the shrink in GEMM needs LoRA slots in the shrink-in-GEMM weights")
        self.spec = spec
        self.weights = weights
        self.lora = lora
        self.plan = plan
        device = weights.embed.device
        self.max_positions = max_positions
        self.rope = cos_sin_cache(
            spec.rope, spec.head_dim, max_positions, device
        )  # [P, D] ([2P, D] longrope)
        # gemma3's sliding-window layers: their own RoPE [P, D] (None: every layer uses ``rope``)
        local = spec.local_rope
        self.local_rope = (
            None if local is None else cos_sin_cache(local, spec.head_dim, max_positions, device)
        )
        self.scale = spec.attention_scale or spec.head_dim**-0.5
        # Gemma: sqrt(H) rounded to the model's dtype first, as transformers does (0-dim)
        embed_dtype = weights.embed.dtype
        self.embed_scale = (
            torch.tensor(spec.hidden_size**0.5, dtype=embed_dtype, device=device) if spec.gemma else None
        )
        # a quantized base's projections through their plan's path (kernels/quant_linear.py)
        quantized = any(
            isinstance(getattr(layer, group), QuantizedWeight)
            for layer in weights.layers
            for group in GEMM_SLICES
        )
        base_linear: Linear = packed_linear if weights.onednn_packed else F.linear
        if quantized:
            base_linear = functools.partial(
                quant_linear, plan=quant_plan or QuantPlan(dequantize_at_load=False)
            )
        self.linear = (
            functools.partial(row_tiled, base_linear, plan.gemm_row_tile)
            if plan.gemm_row_tile
            else base_linear
        )
        # Per-row arrival counters of the residual-add + RMSNorm kernels that do the o / down
        # expand with the shrink in GEMM (kernels/lora_norm.py); every launch leaves them zero.
        counters = plan.bgmv_max_tokens if plan.shrink_in_gemm else 0
        self.row_counters = torch.zeros(counters, dtype=torch.int32, device=device)  # [T]

    def _shrinks_in_gemm(self, group: str, tokens: int, step: LoRAStep | None) -> bool:
        """Whether ``group``'s LoRA term this step comes from the GEMM over its shrink-in-GEMM weight."""
        if step is None or group not in step.groups or self.lora is None:
            return False
        span_rows = (step.slot_span or self.lora.num_slots) * self.lora.max_rank
        return self.plan.shrinks_in_gemm(tokens, span_rows)

    def _row_terms(self, group: str, layer: int, step: LoRAStep | None) -> RowTerms | None:
        """Layer ``layer``'s DoRA / lora_bias row terms of ``group`` when an adapter of the step has them."""
        if step is None or group not in step.row_groups:
            return None
        assert self.lora is not None
        scale, bias = self.lora.row_scale.get(group), self.lora.row_bias.get(group)
        return RowTerms(
            None if scale is None else scale[layer], None if bias is None else bias[layer]
        )  # [slots + 1, N] each

    def _mlp_act(self, layer: int, h: torch.Tensor, step: LoRAStep | None) -> torch.Tensor:
        """act(gate) * up [T, I] of the gate/up projection of ``h``, LoRA term included."""
        weights = self.weights.layers[layer]
        assert weights.gate_up is not None  # a dense MLP
        if self.spec.activation == "gelu_tanh":
            return gelu_tanh_and_mul(self._project_all("gate_up", layer, h, weights.gate_up, step))
        if not self._shrinks_in_gemm("gate_up", h.shape[0], step):
            return silu_and_mul(self._project_all("gate_up", layer, h, weights.gate_up, step))  # [T, I]
        assert self.lora is not None and step is not None
        gate_up, shrunk, b = self._shrink_in_gemm("gate_up", layer, h, step)  # [T, 2 I], [T, span, 2, R]
        rows = self._row_terms("gate_up", layer, step)
        return silu_and_mul_lora(gate_up, shrunk, b, step.batch, self.plan, rows)

    def _shrink_in_gemm(
        self, group: str, layer: int, x: torch.Tensor, step: LoRAStep, with_bias: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One GEMM over ``group``'s shrink-in-GEMM weight, its base rows and the A rows of the
        step's leading ``slot_span`` slots only: the base output [T, N], those slots' shrink
        [T, span, S, R] (views of one output) and their B [span, N, R]."""
        assert self.lora is not None
        lora = self.lora
        span = step.slot_span or lora.num_slots
        rows = lora.shrink_in_gemm_rows(group, span)
        bias = None
        if with_bias:  # q/k/v's bias, with zeros for the A rows
            assert self.weights.shrink_in_gemm_qkv_bias is not None  # allocated with the weights
            bias = self.weights.shrink_in_gemm_qkv_bias[layer][:rows]  # [N + 3 * span * R]
        out = self.linear(x, lora.shrink_in_gemm_weights[group][layer][:rows], bias)
        y, shrunk = lora.split_shrink_in_gemm(group, out)
        return y, shrunk, lora.b[group][layer][:span]

    def _qkv_gemm(
        self, layer: int, h: torch.Tensor, step: LoRAStep | None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, LoRABatch] | None, RowTerms | None]:
        """The q/k/v projection [T, q + 2 kv] and, with the shrink in the GEMM, its expand still
        to do ``(shrunk, lora_b, batch)`` and row terms (None when the LoRA term is in already or
        there is none). DoRA's scale leaves a q/k/v bias out, so a biased q/k/v with row terms
        is done here."""
        weights = self.weights.layers[layer]
        rows = self._row_terms("qkv", layer, step)
        biased_rows = rows is not None and weights.qkv_bias is not None
        if biased_rows or not self._shrinks_in_gemm("qkv", h.shape[0], step):
            return self._project_all("qkv", layer, h, weights.qkv, step, weights.qkv_bias), None, None
        assert self.lora is not None and step is not None
        # [T, N], [T, span, 3, R], [span, N, R]
        qkv, shrunk, b = self._shrink_in_gemm("qkv", layer, h, step, weights.qkv_bias is not None)
        return qkv, (shrunk, b, step.batch), rows

    def _project_all(
        self,
        group: str,
        layer: int,
        x: torch.Tensor,
        weight: Weight,
        step: LoRAStep | None,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x @ weight^T (+ bias)`` [T, N] with the LoRA term and the row terms added, on either
        LoRA path."""
        if not self._shrinks_in_gemm(group, x.shape[0], step):
            y = self._project(group, layer, x, weight, step, bias)
        else:
            assert self.lora is not None and step is not None
            # [T, N], [T, span, S, R], [span, N, R]
            y, shrunk, b = self._shrink_in_gemm(group, layer, x, step, bias is not None)
            lora_expand_shrunk_in_gemm(
                y, shrunk, b, step.batch, self.lora.offsets[group], self.plan, validate=False
            )
        rows = self._row_terms(group, layer, step)
        if rows is None:
            return y
        assert step is not None
        return apply_row_terms(y, rows, step.batch, bias)

    def _project_norm_add_norm(
        self,
        group: str,
        layer: int,
        x: torch.Tensor,
        weight: Weight,
        out_norm: torch.Tensor,
        residual: torch.Tensor,
        norm_weight: torch.Tensor,
        step: LoRAStep | None,
    ) -> torch.Tensor:
        """The Gemma block's ``residual += RMSNorm(x @ weight^T + LoRA)`` in place; returns
        RMSNorm of the new residual [T, H]."""
        y = self._project_all(group, layer, x, weight, step)  # [T, H]
        return norm_add_rms_norm(y, out_norm, residual, norm_weight, self.spec.rms_norm_eps)

    def _project_add_norm(
        self,
        group: str,
        layer: int,
        x: torch.Tensor,
        weight: Weight,
        residual: torch.Tensor,
        norm_weight: torch.Tensor,
        step: LoRAStep | None,
    ) -> torch.Tensor:
        """``residual += x @ weight^T + LoRA`` in place; returns RMSNorm of the new residual [T, H]."""
        eps = self.spec.rms_norm_eps
        if not self._shrinks_in_gemm(group, x.shape[0], step):
            return add_rms_norm(self._project_all(group, layer, x, weight, step), residual, norm_weight, eps)
        assert self.lora is not None and step is not None
        y, shrunk, b = self._shrink_in_gemm(group, layer, x, step)  # [T, H], [T, span, 1, R], [span, H, R]
        rows = self._row_terms(group, layer, step)
        return add_rms_norm_lora(
            y, residual, norm_weight, eps, shrunk, b, step.batch, self.row_counters, self.plan, rows
        )

    def _project(
        self,
        group: str,
        layer: int,
        x: torch.Tensor,
        weight: Weight,
        step: LoRAStep | None,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x @ weight^T (+ bias)`` [T, N] plus the LoRA term of ``group`` for the step's tokens."""
        lora = self.lora
        if step is None or lora is None or group not in step.groups:
            return self.linear(x, weight, bias)
        # The slot buffers and activations are consistent by construction: no argument checks.
        y = self.linear(x, weight, bias)
        a, b = lora.a[group][layer], lora.b[group][layer]
        add_lora(y, x, a, b, step.batch, lora.offsets[group], self.plan, validate=False)
        return y

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        lora: LoRAStep | None,
        embeddings: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Hidden states [T, H] after the final norm, for ``input_ids`` [T] at ``positions`` [T]
        (``embeddings`` [T, H]: the tokens' embeddings when they were taken already, ``embed``)."""
        spec = self.spec
        q_size, eps = spec.q_size, spec.rms_norm_eps
        tokens = input_ids.shape[0]
        layers = self.weights.layers
        rows = rope_rows(spec.rope, positions, attn.seq_lens, attn.query_start_loc, self.max_positions)  # [T]
        local_rows = (
            rows
            if spec.local_rope is None
            else rope_rows(
                spec.local_rope, positions, attn.seq_lens, attn.query_start_loc, self.max_positions
            )
        )  # [T]
        # [T, H], the residual stream
        residual = self.embed(input_ids, None) if embeddings is None else embeddings
        h = rms_norm(residual, layers[0].input_norm, eps)
        for index, layer in enumerate(layers):
            k_cache, v_cache = kv_caches[index]
            qkv, pending, qkv_rows = self._qkv_gemm(index, h, lora)  # [T, q + 2 kv]
            # qwen3, gemma3: RMSNorm of each q and k head ([D] weights), after LoRA and before RoPE
            q_norm, k_norm = layer.q_norm, layer.k_norm
            qk_norm = (q_norm, k_norm, eps) if q_norm is not None and k_norm is not None else None
            # q [T, Hq, D] after the expand (if pending), q/k norms, RoPE and the cache write:
            # one launch if fused
            local = self.local_rope is not None and spec.uses_local_rope(index)
            cos_sin = self.local_rope if local and self.local_rope is not None else self.rope
            q = qkv_rope_write(
                qkv, spec.num_heads, spec.num_kv_heads, cos_sin, local_rows if local else rows,
                k_cache, v_cache, attn.slot_mapping, pending, self.plan, qk_norm, qkv_rows,
            )  # fmt: skip
            context = paged_attention(
                q,
                k_cache,
                v_cache,
                attn.block_tables,
                attn.seq_lens,
                attn.query_start_loc,
                self.scale,
                max_query_len=attn.max_query_len,
                batch_invariant=self.plan.batch_invariant,
                sliding_window=spec.window_of(index),
                softcap=spec.attn_softcap,
            ).view(tokens, q_size)  # [T, q]
            next_norm = layers[index + 1].input_norm if index + 1 < len(layers) else self.weights.final_norm
            if layer.attn_out_norm is not None and layer.mlp_out_norm is not None:  # the Gemma block
                assert layer.down is not None  # a dense MLP
                h = self._project_norm_add_norm(
                    "o", index, context, layer.o, layer.attn_out_norm, residual, layer.post_norm, lora
                )
                act = self._mlp_act(index, h, lora)  # [T, I]
                h = self._project_norm_add_norm(
                    "down", index, act, layer.down, layer.mlp_out_norm, residual, next_norm, lora
                )
                continue
            # residual += o (+ LoRA), h = its RMSNorm
            h = self._project_add_norm("o", index, context, layer.o, residual, layer.post_norm, lora)
            if layer.experts is not None:  # residual += the experts' output, h = its RMSNorm
                assert spec.moe is not None
                h = add_rms_norm(moe_mlp(h, layer.experts, spec.moe), residual, next_norm, eps)  # [T, H]
                continue
            assert layer.down is not None  # a dense MLP
            act = self._mlp_act(index, h, lora)  # [T, I]
            # residual += down (+ LoRA), h = its RMSNorm with the next layer's (or the final) weight
            h = self._project_add_norm("down", index, act, layer.down, residual, next_norm, lora)
        return h

    def embed(self, input_ids: torch.Tensor, vocab: VocabRows | None) -> torch.Tensor:
        """The embeddings [T, H] of ``input_ids`` [T] (scaled where the family scales them), each
        token from its adapter's tables where ``vocab`` gives them."""
        embed = self.weights.embed
        out = F.embedding(input_ids, embed) if vocab is None else embed_tokens(input_ids, embed, vocab)
        return out if self.embed_scale is None else out * self.embed_scale

    def logits(self, hidden: torch.Tensor, vocab: VocabRows | None = None, width: int = 0) -> torch.Tensor:
        """[N, V] float32 logits of the given hidden rows (see ``head_logits``)."""
        return self.head_logits(hidden, vocab, width).float()

    def head_logits(
        self, hidden: torch.Tensor, vocab: VocabRows | None = None, width: int = 0
    ) -> torch.Tensor:
        """[N, V] logits of the given hidden rows in the model's dtype (the LM head's GEMM output,
        soft-capped where the family caps it); with ``vocab``, each row through its adapter's
        head or retrained rows, [N, width] padded with -inf."""
        if vocab is None:
            return self._capped(self.linear(hidden, self.weights.lm_head))  # [N, V]
        lm_head = self.weights.lm_head

        def head(rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # the base's may be packed
            return self._capped((self.linear if weight is lm_head else F.linear)(rows, weight))

        return logits_with_tables(hidden, head, lm_head, vocab, width)

    def _capped(self, logits: torch.Tensor) -> torch.Tensor:
        cap = self.spec.final_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap
