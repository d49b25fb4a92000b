"""Log-probabilities of chosen tokens and their top-k alternatives, from the logits the sampler read.

They are those of the model's own distribution (raw logits, before temperature, top-k, top-p or
any other sampling filter), as OpenAI reports them. Only rows that ask are computed, without
materialising a log-softmax (logit - logsumexp), and a step's results travel to the host in one
copy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from multilora_studio.engine.outputs import TokenLogprob

SCORE_CHUNK_ROWS = 1024  # prompt rows whose full-vocabulary logits exist at once
TOP_K_BLOCKS = 128  # top-k over a large vocabulary: per block of the row first, then over the blocks' winners


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
    """Log-probability and rank of ``chosen`` [R] under ``logits`` [R, V] float32, and the top ``k``."""
    norm = torch.logsumexp(logits, dim=-1, keepdim=True)  # [R, 1]
    picked = logits.gather(1, chosen[:, None])  # [R, 1]
    rank = (logits > picked).sum(dim=-1, keepdim=True) + 1  # [R, 1]
    columns = [picked - norm, rank.float()]
    if k > 0:
        values, ids = top_k(logits, k)  # [R, k]
        columns += [ids.float(), values - norm]
    return ScoredRows(torch.cat(columns, dim=1), k)


def top_k(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest values of each row of ``logits`` [R, V] and their ids, largest first ([R, k] each).

    Semantics: ``torch.topk(logits, k, dim=-1)`` (ties in either order). On a large vocabulary
    ``torch.topk`` selects over each whole row in one block; two rounds over blocks of the row
    (``TOP_K_BLOCKS`` of them) do the same work in short rows, and k = 1 is a max.
    """
    if k == 1:
        values, ids = logits.max(dim=-1, keepdim=True)
        return values, ids
    rows, vocab = logits.shape
    if vocab < 8 * k * TOP_K_BLOCKS:
        top = torch.topk(logits, k, dim=-1)
        return top.values, top.indices
    width = -(-vocab // TOP_K_BLOCKS)
    padded = torch.nn.functional.pad(logits, (0, width * TOP_K_BLOCKS - vocab), value=float("-inf"))
    block_values, block_ids = padded.view(rows, TOP_K_BLOCKS, width).topk(k, dim=-1)  # [R, B, k]
    offsets = torch.arange(TOP_K_BLOCKS, device=logits.device)[:, None] * width  # [B, 1]
    values, picked = block_values.view(rows, -1).topk(k, dim=-1)  # [R, k] of the B * k winners
    return values, (block_ids + offsets).view(rows, -1).gather(1, picked)


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
