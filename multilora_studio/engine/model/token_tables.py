"""Adapters' token tables on the device, and a step's embedding and logits with them.

An adapter that replaces embedding or LM-head rows (``modules_to_save``, trainable or added
tokens: ``adapters/token_tables.py``) has its tables in this pool while it holds a GPU slot,
within a budget of its own: a count (``EngineConfig.max_token_tables``) and bytes
(``EngineConfig.token_table_memory_gb``). A step whose rows use none runs as before (and
through the CUDA graphs); a step with some runs eagerly and

- embeds by gather: every token from the base's matrix, then each such adapter's tokens from
  its own matrix (or its retrained rows swapped in);
- computes logits per adapter group: the base head for every row, then each group's rows
  through its own head (or its retrained rows' columns), padded with -inf to the widest
  vocabulary of the step, so sampling and log-probabilities see each row's own vocabulary.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from multilora_studio.adapters.token_tables import TokenTables

Head = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (hidden [r, H], weight [V, H]) -> [r, V]


class TokenTablePool:
    """The token tables of the adapters in GPU slots, by slot, under a count and a byte budget.

    The retrained rows of every adapter in the pool are also kept as one set per side
    (``embed_swaps`` / ``head_swaps``), so a step swaps all of them with one set of launches
    whatever the number of adapters.
    """

    def __init__(self, max_tables: int, max_bytes: int, device: torch.device) -> None:
        self.max_tables = max_tables
        self.max_bytes = max_bytes
        self.device = device
        self.tables: dict[int, TokenTables] = {}
        self.embed_swaps: RowSwaps | None = None
        self.head_swaps: RowSwaps | None = None
        # Every copy and swap set is made on the steps' stream, also when a slot is filled from
        # the side stream of uploads: a step of other adapters that runs meanwhile reads the
        # swap sets, so they must be complete before it (a whole matrix's copy, ~40 ms for an
        # 8B lm_head, holds up the next step once, when such an adapter enters a slot).
        self.step_stream = torch.cuda.current_stream(device) if device.type == "cuda" else None

    @property
    def used_bytes(self) -> int:
        return sum(t.nbytes for t in self.tables.values())

    def has_room(self, nbytes: int, slot: int) -> bool:
        """Whether tables of ``nbytes`` fit in ``slot`` with the other slots' tables."""
        others = [t for s, t in self.tables.items() if s != slot]
        return len(others) < self.max_tables and sum(t.nbytes for t in others) + nbytes <= self.max_bytes

    def put(self, slot: int, tables: TokenTables | None) -> None:
        """``slot``'s tables from host copies, or none."""
        with self._on_step_stream():
            self.tables.pop(slot, None)
            if tables is not None:

                def copy(tensor: torch.Tensor | None) -> torch.Tensor | None:
                    return None if tensor is None else tensor.to(self.device, non_blocking=True)

                embed = copy(tables.embed)
                head = embed if tables.head is tables.embed else copy(tables.head)  # tied: one copy
                self.tables[slot] = TokenTables(
                    tables.vocab_size,
                    tables.base_vocab,
                    embed,
                    head,
                    copy(tables.embed_ids),
                    copy(tables.embed_rows),
                    copy(tables.head_ids),
                    copy(tables.head_rows),
                )
            self._gather_swaps()

    def _on_step_stream(self) -> contextlib.AbstractContextManager:
        return (
            torch.cuda.stream(self.step_stream) if self.step_stream is not None else contextlib.nullcontext()
        )

    def clear(self, slot: int) -> None:
        with self._on_step_stream():
            if self.tables.pop(slot, None) is not None:
                self._gather_swaps()

    def _gather_swaps(self) -> None:
        self.embed_swaps = self._swaps("embed")
        self.head_swaps = self._swaps("head")

    def _swaps(self, side: str) -> RowSwaps | None:
        parts = [
            (slot, getattr(t, f"{side}_ids"), getattr(t, f"{side}_rows"))
            for slot, t in sorted(self.tables.items())
            if getattr(t, f"{side}_ids") is not None
        ]
        if not parts:
            return None
        slots = torch.cat([torch.full_like(ids, slot, dtype=torch.int32) for slot, ids, _ in parts])
        return RowSwaps(
            torch.cat([ids for _, ids, _ in parts]), slots, torch.cat([rows for _, _, rows in parts])
        )

    def whole(self, side: str, slot: int) -> torch.Tensor | None:
        """``slot``'s whole embedding (``side`` "embed") or head ("head") matrix, if it has one."""
        tables = self.tables.get(slot)
        return None if tables is None else getattr(tables, side)


@dataclass
class RowSwaps:
    """The retrained rows of every adapter in the pool, as one set: row k replaces token
    ``ids[k]`` for the rows of slot ``slots[k]``."""

    ids: torch.Tensor  # [K] int64
    slots: torch.Tensor  # [K] int32
    rows: torch.Tensor  # [K, H]


@dataclass
class VocabRows:
    """One side's work for a set of rows (the step's tokens, or its sampled or scored rows):
    (rows, matrix) for the adapters with a whole matrix, and each row's slot for the swaps."""

    whole: list[tuple[torch.Tensor, torch.Tensor]]  # ([n] int64 rows, [V_a, H] matrix)
    slots: torch.Tensor  # [N] int32: each row's slot (-1: the base)
    swaps: RowSwaps | None

    def within(self, begin: int, end: int) -> VocabRows:
        """The same work for rows ``begin:end`` (renumbered from 0)."""
        whole = [(rows[(rows >= begin) & (rows < end)] - begin, matrix) for rows, matrix in self.whole]
        return VocabRows(whole, self.slots[begin:end], self.swaps)


@dataclass
class TokenTableStep:
    """The step's adapters with token tables; ``width``: the widest vocabulary of its rows."""

    width: int
    embed: VocabRows  # over the step's tokens
    head: VocabRows  # over the sampled rows
    scored: VocabRows  # over the scored prompt rows


def embed_tokens(input_ids: torch.Tensor, embed: torch.Tensor, vocab: VocabRows) -> torch.Tensor:
    """Embeddings [T, H] of ``input_ids`` [T], each token from its adapter's tables."""
    out = F.embedding(input_ids.clamp_max(embed.shape[0] - 1), embed)  # [T, H]; added ids read below
    for rows, matrix in vocab.whole:
        out[rows] = F.embedding(input_ids[rows], matrix)
    swaps = vocab.swaps
    if swaps is None:
        return out
    match = (input_ids[:, None] == swaps.ids[None, :]) & (
        vocab.slots[:, None] == swaps.slots[None, :]
    )  # [T, K]
    which = match.to(torch.int32).argmax(dim=1)  # [T]
    return torch.where(match.any(dim=1)[:, None], swaps.rows[which].to(out.dtype), out)


def logits_with_tables(
    hidden: torch.Tensor, head: Head, base_head: torch.Tensor, vocab: VocabRows, width: int
) -> torch.Tensor:
    """Logits [N, width] of ``hidden`` [N, H]: the base head's, each whole-matrix group's rows
    through its own head, each row's retrained columns from its adapter's rows; columns past
    a row's vocabulary are -inf.

    ``head(hidden, weight)`` is the model's head on any weight (soft-cap included).
    """
    swaps = vocab.swaps
    spare = 1 if swaps is not None else 0  # a column the other adapters' swaps are written to
    base = head(hidden, base_head)  # [N, V]
    out = F.pad(base, (0, width + spare - base.shape[1]), value=float("-inf"))  # [N, width (+1)]
    for rows, matrix in vocab.whole:
        if rows.numel():
            own = head(hidden[rows], matrix)  # [r, V_a]
            out[rows] = F.pad(own, (0, width + spare - own.shape[1]), value=float("-inf"))
    if swaps is None:
        return out
    owner = vocab.slots[:, None] == swaps.slots[None, :]  # [N, K]
    columns = torch.where(owner, swaps.ids[None, :], width)  # [N, K]; each row's own ids are distinct
    out.scatter_(1, columns, head(hidden, swaps.rows).to(out.dtype))
    return out[:, :width].contiguous()
