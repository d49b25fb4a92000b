"""The logits processors' formulas, one row and one token at a time (OpenAI's penalties, HF's
repetition penalty, vLLM's bad words and min_tokens), as references for the vectorised ones."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from multilora_studio.engine.sampling_params import SamplingParams


def reference_row(
    logits: torch.Tensor, p: SamplingParams, prompt: list[int], output: list[int], eos: Sequence[int]
) -> torch.Tensor:
    """One row [V]: bans, logit_bias, repetition penalty, then frequency and presence penalties."""
    x = logits.clone().double()
    for word in p.bad_words_token_ids:
        if len(word) == 1 or output[-(len(word) - 1) :] == list(word[:-1]):
            x[word[-1]] = float("-inf")
    if len(output) < p.min_tokens:
        for t in list(p.stop_token_ids) + ([] if p.ignore_eos else list(eos)):
            x[t] = float("-inf")
    for t, b in p.logit_bias.items():
        x[t] += b
    for t in set(prompt) | set(output):
        x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    for t in set(output):
        x[t] -= p.frequency_penalty * output.count(t) + p.presence_penalty
    return x.float()
