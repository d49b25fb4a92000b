"""Log-probabilities of chosen tokens and their top-k alternatives, from the logits the sampler read.

They are those of the model's own distribution (raw logits, before temperature, top-k, top-p or
any other sampling filter), as OpenAI reports them. Only rows that ask are computed, without
materialising a log-softmax (logit - logsumexp), and a step's results travel to the host in one
copy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import overload

import torch

from multilora_studio.engine.outputs import TokenLogprob
from multilora_studio.kernels.row_scores import row_scores

SCORE_CHUNK_BYTES = 256 << 20  # full-vocabulary logits of scored prompt rows that exist at once


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
        """One entry per row (host tensors) with row i's ``ks[i]`` alternatives; ``tokens``: chosen ids.

        Columns are converted whole (a scored 16k-token prompt: 13 ms here against 135 ms row by row).
        """
        k, packed = self.k, self.packed
        logprobs = packed[:, 0].tolist()
        ranks = packed[:, 1].int().tolist()
        ids = packed[:, 2 : 2 + k].int().tolist()
        values = packed[:, 2 + k :].tolist()
        return [
            TokenLogprob(token, logprob, rank, tuple(zip(row_ids[:wanted], row_values[:wanted], strict=True)))
            for token, logprob, rank, row_ids, row_values, wanted in zip(
                tokens, logprobs, ranks, ids, values, ks, strict=True
            )
        ]


class PromptScores(Sequence[TokenLogprob | None]):
    """A prompt's scores: None for position 0 (and the tokens before ``prompt_logprobs_start``), then
    one ``TokenLogprob`` per later token.

    Kept as the packed host rows the steps returned; the entries are built on first access, by
    whichever thread reads them, so the engine's worker does no per-token work for them.
    """

    def __init__(self, parts: list[ScoredRows], targets: list[int], k: int, unscored: int = 0) -> None:
        self._parts = parts  # host rows of the scored positions unscored..n-2, in order
        self._targets = targets  # the prompt's tokens unscored + 1..n-1
        self._k = k
        self._unscored = unscored  # tokens 1..unscored are not scored (``prompt_logprobs_start``)
        self._entries: list[TokenLogprob | None] | None = None

    def _built(self) -> list[TokenLogprob | None]:
        if self._entries is None:
            entries: list[TokenLogprob | None] = [None] * (1 + self._unscored)
            begin = 0
            for part in self._parts:
                count = len(part.packed)
                entries += part.entries([self._k] * count, self._targets[begin : begin + count])
                begin += count
            self._entries = entries
        return self._entries

    def __len__(self) -> int:
        return 1 + self._unscored + len(self._targets)

    @overload
    def __getitem__(self, index: int) -> TokenLogprob | None: ...
    @overload
    def __getitem__(self, index: slice) -> list[TokenLogprob | None]: ...
    def __getitem__(self, index: int | slice) -> TokenLogprob | list[TokenLogprob | None] | None:
        return self._built()[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PromptScores | list | tuple):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PromptScores({self._built()!r})"


def score_rows(logits: torch.Tensor, chosen: torch.Tensor, k: int) -> ScoredRows:
    """Log-probability and rank of ``chosen`` [R] under ``logits`` [R, V], the top ``k``: ``row_scores``."""
    return ScoredRows(row_scores(logits, chosen, k), k)


def score_chunk_rows(vocab: int, dtype: torch.dtype) -> int:
    """Prompt rows scored at once: as many as SCORE_CHUNK_BYTES of logits hold (1,046 at 128k in bf16)."""
    return max(1, SCORE_CHUNK_BYTES // (vocab * dtype.itemsize))


def score_hidden_rows(
    logits_of: Callable[[torch.Tensor, int], torch.Tensor],
    hidden: torch.Tensor,
    targets: torch.Tensor,
    k: int,
    chunk_rows: int,
) -> ScoredRows:
    """``score_rows`` for hidden states [R, H] and their next tokens [R], ``chunk_rows`` at a time.

    ``logits_of(hidden_rows, first_row) -> [r, V]`` (the model's head, in its dtype; ``first_row``:
    the index of ``hidden_rows[0]`` among ``hidden``'s rows); a long prompt never holds
    full-vocabulary logits for more than ``chunk_rows`` rows (``score_chunk_rows``).
    """
    parts = []
    for begin in range(0, len(targets), chunk_rows):
        end = begin + chunk_rows
        logits = logits_of(hidden[begin:end], begin)  # [r, V]
        parts.append(score_rows(logits, targets[begin:end], k))
    return ScoredRows.concat(parts)
