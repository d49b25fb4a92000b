"""Token sampling for a batch where each row has its own parameters and random stream."""

from __future__ import annotations

import torch

from multilora_studio.engine.sampling.sampling_batch import SamplingBatch
from multilora_studio.engine.sampling_params import SamplingParams


def make_generator(
    params: SamplingParams, device: torch.device, fallback_seed: int
) -> torch.Generator | None:
    """A per-request random stream (seeded when the request gives a seed); None for greedy."""
    if params.greedy:
        return None
    seed = params.seed if params.seed is not None else fallback_seed
    return torch.Generator(device=device).manual_seed(seed)


def _filter(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, min-p, top-k and top-p, in that order (vLLM's), on one row [V] of float32 logits."""
    logits = logits / params.temperature
    if params.min_p > 0.0:
        probs = logits.softmax(-1)  # [V]
        logits = logits.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
    if 0 < params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop = cumulative - sorted_logits.softmax(-1) >= params.top_p  # keep the token that crosses top_p
        drop[0] = False  # the most likely token always stays, however small top_p is
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return logits


def sample(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """One token per row of ``logits`` [N, V] float32, by ``batch``'s rows: [N] int64 on the
    logits' device (no host sync)."""
    greedy = logits.argmax(dim=-1)  # [N]
    sampled_rows = [row for row, r in enumerate(batch.rows) if not r.params.greedy]
    if not sampled_rows:
        return greedy
    chosen = greedy.clone()
    for row in sampled_rows:
        params, generator = batch.rows[row].params, batch.rows[row].generator
        probs = _filter(logits[row], params).softmax(-1)  # [V]
        # A numerically degenerate row (non-finite logits) samples its greedy token instead of
        # failing; decided on the device, without a host sync.
        fallback = torch.nn.functional.one_hot(greedy[row], probs.shape[-1]).to(probs.dtype)
        probs = torch.where(torch.isfinite(probs).all(), probs, fallback)
        chosen[row] = torch.multinomial(probs, 1, generator=generator)[0]
    return chosen
