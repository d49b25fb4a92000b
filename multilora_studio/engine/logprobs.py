"""Log-probabilities of chosen tokens and their top-k alternatives, from the logits the sampler read.

They are those of the model's own distribution (raw logits, before temperature, top-k, top-p or
any other sampling filter), as OpenAI reports them. Only rows that ask are computed, without
materialising a log-softmax (logit - logsumexp), and a step's results travel to the host in one
copy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from multilora_studio.engine.outputs import TokenLogprob

SCORE_CHUNK_ROWS = 256  # prompt rows whose full-vocabulary logits exist at once
MAX_ROW_BLOCKS = 256  # reductions over a row run in up to this many blocks of it


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """On CUDA a host copy of ``tensor`` enqueued on its stream (pinned, not waited for); else itself."""
    return tensor.to("cpu", non_blocking=True) if tensor.device.type == "cuda" else tensor


@dataclass
class ScoredRows:
    """R rows' scores, packed so one copy moves them: [R, 2 + 2k] float32.

    Columns: the chosen token's log-probability, its rank (1 = most likely), the k most likely
    token ids, their log-probabilities (ids and ranks below 2**24 are exact in float32).
    """

    packed: torch.Tensor  # [R, 2 + 2k] float32
    k: int

    def to_host(self) -> ScoredRows:
        return ScoredRows(to_host(self.packed), self.k)

    def rows(self, part: slice) -> ScoredRows:
        return ScoredRows(self.packed[part], self.k)

    @staticmethod
    def concat(parts: list[ScoredRows]) -> ScoredRows:
        return ScoredRows(torch.cat([p.packed for p in parts]), parts[0].k)

    def entries(self, ks: list[int], tokens: list[int]) -> list[TokenLogprob]:
        """One entry per row (host tensors) with row i's ``ks[i]`` alternatives; ``tokens``: chosen ids."""
        k = self.k
        result = []
        for row, wanted, token in zip(self.packed.tolist(), ks, tokens, strict=True):
            ids = row[2 : 2 + wanted]
            values = row[2 + k : 2 + k + wanted]
            result.append(
                TokenLogprob(token, row[0], int(row[1]), tuple(zip(map(int, ids), values, strict=True)))
            )
        return result


def score_rows(logits: torch.Tensor, chosen: torch.Tensor, k: int) -> ScoredRows:
    """Log-probability and rank of ``chosen`` [R] under ``logits`` [R, V] float32, and the top ``k``.

    Semantics: ``lp = log_softmax(logits)``; the chosen token's ``lp``, its rank (1 + the count of
    larger logits) and ``torch.topk(lp, k)``. Reductions run over blocks of each row first
    (``blocked``): a decode step has few rows, and one block per long row leaves the GPU idle.
    """
    blocks = blocked(logits)  # [R, B, W]
    norm = torch.logsumexp(torch.logsumexp(blocks, dim=-1), dim=-1, keepdim=True)  # [R, 1]
    picked = logits.gather(1, chosen[:, None])  # [R, 1]
    rank = (blocks > picked[:, :, None]).sum(dim=-1).sum(dim=-1, keepdim=True) + 1  # [R, 1]
    columns = [picked - norm, rank.float()]
    if k > 0:
        values, ids = top_k(logits, k)  # [R, k]
        columns += [ids.float(), values - norm]
    return ScoredRows(torch.cat(columns, dim=1), k)


def blocked(logits: torch.Tensor) -> torch.Tensor:
    """``logits`` [R, V] viewed as [R, B, V / B] (B the largest power of two <= 256 dividing V; no copy)."""
    rows, vocab = logits.shape
    width = vocab // math.gcd(vocab, MAX_ROW_BLOCKS)
    return logits.view(rows, vocab // width, width)


def top_k(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest values of each row of ``logits`` [R, V] and their ids, largest first ([R, k] each).

    Semantics: ``torch.topk(logits, k, dim=-1)`` (ties in either order); k = 1 is a blocked max.
    """
    if k > 1:
        top = torch.topk(logits, k, dim=-1)
        return top.values, top.indices
    blocks = blocked(logits)  # [R, B, W]
    block_values, block_ids = blocks.max(dim=-1)  # [R, B]
    values, best = block_values.max(dim=-1, keepdim=True)  # [R, 1]
    return values, best * blocks.shape[-1] + block_ids.gather(1, best)


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
