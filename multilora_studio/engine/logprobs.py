"""Log-probabilities of chosen tokens and their top-k alternatives, from the logits the sampler read.

They are those of the model's own distribution (raw logits, before temperature, top-k, top-p or
any other sampling filter), as OpenAI reports them. Only rows that ask are computed; the results
stay on the device until the step's one host copy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from multilora_studio.engine.outputs import TokenLogprob

SCORE_CHUNK_ROWS = 256  # prompt rows whose full-vocabulary logits exist at once


@dataclass
class ScoredRows:
    """Device results for R rows: chosen log-probabilities and ranks, and the top k (the most asked)."""

    logprob: torch.Tensor  # [R] float32
    rank: torch.Tensor  # [R] int64, 1 = the most likely token
    top_ids: torch.Tensor  # [R, k] int64, most likely first
    top_logprobs: torch.Tensor  # [R, k] float32

    @staticmethod
    def concat(parts: list[ScoredRows]) -> ScoredRows:
        return ScoredRows(
            torch.cat([p.logprob for p in parts]),
            torch.cat([p.rank for p in parts]),
            torch.cat([p.top_ids for p in parts]),
            torch.cat([p.top_logprobs for p in parts]),
        )

    def to_host(self) -> HostScores:
        """Copies to host memory, enqueued without waiting (read after the step's synchronisation)."""
        return HostScores(*(to_host(t) for t in (self.logprob, self.rank, self.top_ids, self.top_logprobs)))


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """On CUDA a host copy of ``tensor`` enqueued on its stream (pinned, not waited for); else itself."""
    return tensor.to("cpu", non_blocking=True) if tensor.device.type == "cuda" else tensor


@dataclass
class HostScores:
    """``ScoredRows`` in host memory."""

    logprob: torch.Tensor
    rank: torch.Tensor
    top_ids: torch.Tensor
    top_logprobs: torch.Tensor

    def rows(self, part: slice) -> HostScores:
        return HostScores(self.logprob[part], self.rank[part], self.top_ids[part], self.top_logprobs[part])

    def entries(self, ks: list[int], tokens: list[int]) -> list[TokenLogprob]:
        """One TokenLogprob per row, with row i's ``ks[i]`` alternatives; ``tokens``: the rows' chosen ids."""
        logprob, rank = self.logprob.tolist(), self.rank.tolist()
        top_ids, top_lp = self.top_ids.tolist(), self.top_logprobs.tolist()
        return [
            TokenLogprob(token, logprob[i], rank[i], tuple(zip(top_ids[i][:k], top_lp[i][:k], strict=True)))
            for i, (k, token) in enumerate(zip(ks, tokens, strict=True))
        ]


def score_rows(logits: torch.Tensor, chosen: torch.Tensor, k: int) -> ScoredRows:
    """Log-probability and rank of ``chosen`` [R] under ``logits`` [R, V] float32, and the top ``k``."""
    logprobs = torch.log_softmax(logits, dim=-1)  # [R, V]
    picked = logprobs.gather(1, chosen[:, None])  # [R, 1]
    rank = (logprobs > picked).sum(dim=-1) + 1  # [R]
    top = torch.topk(logprobs, k, dim=-1) if k > 0 else None
    empty_ids = torch.empty((len(chosen), 0), dtype=torch.int64, device=logits.device)
    empty_lp = torch.empty((len(chosen), 0), dtype=torch.float32, device=logits.device)
    return ScoredRows(
        picked[:, 0],
        rank,
        top.indices if top is not None else empty_ids,
        top.values if top is not None else empty_lp,
    )


def score_hidden_rows(
    logits_of: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, targets: torch.Tensor, k: int
) -> ScoredRows:
    """``score_rows`` for hidden states [R, H] and their next tokens [R], SCORE_CHUNK_ROWS at a time.

    ``logits_of(hidden_rows) -> [r, V] float32`` (the model's head); a long prompt never holds
    full-vocabulary logits for more than SCORE_CHUNK_ROWS rows.
    """
    parts = []
    for begin in range(0, len(targets), SCORE_CHUNK_ROWS):
        end = begin + SCORE_CHUNK_ROWS
        logits = logits_of(hidden[begin:end])  # [r, V] float32
        parts.append(score_rows(logits, targets[begin:end], k))
    return ScoredRows.concat(parts)
