"""The mixture-of-experts MLP (qwen3_moe, mixtral) on a torch path, routed as transformers routes.

Per layer a router GEMM gives each token's expert logits; the softmax (float32) picks the
``top_k`` experts, whose weights are renormalised to sum to 1 where the family does
(``MoESpec.norm_topk_prob``). Each expert the step touches then runs over its own tokens:
gate_up GEMM, SiLU(gate) * up, down GEMM, scaled by the routing weight and added back into
the tokens' rows. LoRA does not reach the experts or the router.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from multilora_studio.engine.model.model_spec import MoESpec
from multilora_studio.engine.model.moe_weights import ExpertWeights


def route(h: torch.Tensor, router: torch.Tensor, moe: MoESpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's experts [T, k] (int64) and their weights [T, k] (float32) for ``h`` [T, H]."""
    logits = F.linear(h, router)  # [T, E]
    probs = torch.softmax(logits.float(), dim=-1)  # [T, E]
    weights, experts = torch.topk(probs, moe.top_k, dim=-1)  # [T, k], [T, k]
    if moe.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return experts, weights


def moe_mlp(h: torch.Tensor, layer: ExpertWeights, moe: MoESpec) -> torch.Tensor:
    """The mixture-of-experts MLP's output [T, H] for the normed hidden states ``h`` [T, H]."""
    experts, weights = route(h, layer.router, moe)  # [T, k], [T, k]
    if not moe.weights_in_float32:
        weights = weights.to(h.dtype)  # qwen3_moe scales in the activations' dtype
    out = torch.zeros_like(h)  # [T, H]
    flat = experts.flatten()  # [T k], token t's choices at t k .. t k + k - 1
    order = torch.argsort(flat, stable=True)  # [T k], grouped by expert, tokens ascending
    counts = torch.bincount(flat, minlength=moe.num_experts).tolist()  # [E] (one host sync)
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        picks = order[start : start + count]  # [n], indices into [T k]
        start += count
        tokens = picks // moe.top_k  # [n]
        gate, up = F.linear(h[tokens], layer.gate_up[expert]).chunk(2, dim=-1)  # [n, I] each
        y = F.linear(F.silu(gate) * up, layer.down[expert])  # [n, H]
        scaled = y * weights.flatten()[picks, None]  # [n, H] (float32 where the weights are)
        out.index_add_(0, tokens, scaled.to(out.dtype))
    return out
