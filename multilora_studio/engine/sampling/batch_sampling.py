"""A step's sampling rows from logits to host tokens: each row's logits processors, its grammar's
mask, its draw, and the log-probabilities it asks for, brought to the host with the step's one
device wait."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from multilora_studio.engine.outputs import TokenLogprob
from multilora_studio.engine.sampling.grammar import apply_token_masks
from multilora_studio.engine.sampling.logits_processors import apply_processors
from multilora_studio.engine.sampling.logprobs import ScoredRows, score_rows, to_host
from multilora_studio.engine.sampling.sampler import sample
from multilora_studio.engine.sampling.sampling_batch import SamplingBatch


@dataclass
class SampledBatch:
    """What a step's logits gave, on the host."""

    tokens: list[int]  # one per sampling row
    logprobs: list[TokenLogprob | None]  # per sampling row; None where the request asked for none
    prompt_scores: ScoredRows | None  # the scored prompt rows, if the step had any


@torch.inference_mode()
def sample_batch(
    logits: torch.Tensor, batch: SamplingBatch, prompt_scores: ScoredRows | None
) -> SampledBatch:
    """Sample each of ``batch``'s rows of ``logits`` [N, V] float32 (after the logits processors,
    within its grammar's mask), score the rows that asked, and bring them and ``prompt_scores``
    to the host with one wait.

    Log-probabilities are scored from the raw ``logits``. When no row asks for them, the
    processors update ``logits`` in place (nothing reads it after this step; under CUDA graphs
    it is the graph's output buffer, which the next replay overwrites).
    """
    params = [row.params for row in batch.rows]
    wanted = [row for row, p in enumerate(params) if p.logprobs is not None]
    processed = apply_processors(logits, batch, in_place=not wanted)  # [N, V]
    masks = batch.masks
    allowed = apply_token_masks(processed, masks) if masks is not None else processed  # [N, V]
    tokens = sample(allowed, batch)  # [N] on the device
    scores = None
    if wanted:
        k = max(params[row].logprobs or 0 for row in wanted)
        if len(wanted) == len(params):
            scores = score_rows(logits, tokens, k)
        else:
            index = torch.tensor(wanted).to(logits.device, non_blocking=True)
            scores = score_rows(logits[index], tokens[index], k)
    host_tokens = to_host(tokens)
    host_scores = scores.to_host() if scores is not None else None
    host_prompt = prompt_scores.to_host() if prompt_scores is not None else None
    if logits.device.type == "cuda":
        torch.cuda.current_stream(logits.device).synchronize()  # the step's one wait
    token_list = host_tokens.tolist()
    logprobs: list[TokenLogprob | None] = [None] * len(params)
    if host_scores is not None:
        entries = host_scores.entries(
            [params[r].logprobs or 0 for r in wanted], [token_list[r] for r in wanted]
        )
        for row, entry in zip(wanted, entries, strict=True):
            logprobs[row] = entry
    return SampledBatch(token_list, logprobs, host_prompt)
