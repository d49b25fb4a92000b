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

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from multilora_studio.adapters.token_tables import TokenTables

Head = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (hidden [r, H], weight [V, H]) -> [r, V]


class TokenTablePool:
    """The token tables of the adapters in GPU slots, by slot, under a count and a byte budget."""

    def __init__(self, max_tables: int, max_bytes: int, device: torch.device) -> None:
        self.max_tables = max_tables
        self.max_bytes = max_bytes
        self.device = device
        self.tables: dict[int, TokenTables] = {}
        # the stream the steps read the tables on: their memory is not reused (after a slot is
        # refilled) before the steps queued there have run
        self.step_stream = torch.cuda.current_stream(device) if device.type == "cuda" else None

    @property
    def used_bytes(self) -> int:
        return sum(t.nbytes for t in self.tables.values())

    def fits_alone(self, nbytes: int) -> bool:
        return nbytes <= self.max_bytes

    def has_room(self, nbytes: int, slot: int) -> bool:
        """Whether tables of ``nbytes`` fit in ``slot`` with the other slots' tables."""
        others = [t for s, t in self.tables.items() if s != slot]
        return len(others) < self.max_tables and sum(t.nbytes for t in others) + nbytes <= self.max_bytes

    def put(self, slot: int, tables: TokenTables | None) -> None:
        """``slot``'s tables from host copies (on the current stream), or none."""
        self.tables.pop(slot, None)
        if tables is None:
            return

        def copy(tensor: torch.Tensor | None) -> torch.Tensor | None:
            if tensor is None:
                return None
            moved = tensor.to(self.device, non_blocking=True)
            if self.step_stream is not None:
                moved.record_stream(self.step_stream)
            return moved

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

    def clear(self, slot: int) -> None:
        self.tables.pop(slot, None)


@dataclass
class TableRows:
    """One adapter's tables and the step's rows that read them."""

    tables: TokenTables  # on the device
    tokens: torch.Tensor  # [n] int64: its rows among the step's tokens
    logits_rows: torch.Tensor  # [m] int64: its rows among the sampled rows
    score_rows: torch.Tensor  # [s] int64: its rows among the scored prompt rows


@dataclass
class TokenTableStep:
    """The step's adapters with token tables; ``width``: the widest vocabulary of its rows."""

    width: int
    groups: list[TableRows]


def embed_tokens(input_ids: torch.Tensor, embed: torch.Tensor, step: TokenTableStep | None) -> torch.Tensor:
    """Embeddings [T, H] of ``input_ids`` [T], each token from its adapter's table if it has one."""
    if step is None:
        return F.embedding(input_ids, embed)
    vocab = embed.shape[0]
    out = F.embedding(input_ids.clamp_max(vocab - 1), embed)  # [T, H]; added ids read below
    for group in step.groups:
        tables, rows = group.tables, group.tokens
        ids = input_ids[rows]  # [n]
        if tables.embed is not None:
            out[rows] = F.embedding(ids, tables.embed)
        elif tables.embed_ids is not None and tables.embed_rows is not None:
            out[rows] = swap_rows(out[rows], ids, tables.embed_ids, tables.embed_rows)
    return out


def swap_rows(
    values: torch.Tensor, ids: torch.Tensor, table_ids: torch.Tensor, table_rows: torch.Tensor
) -> torch.Tensor:
    """``values`` [n, H] with the rows whose id [n] is among ``table_ids`` [k] taken from
    ``table_rows`` [k, H]."""
    match = ids[:, None] == table_ids[None, :]  # [n, k]
    which = match.to(torch.int32).argmax(dim=1)  # [n]
    return torch.where(match.any(dim=1)[:, None], table_rows[which].to(values.dtype), values)


def logits_with_tables(
    hidden: torch.Tensor,
    head: Head,
    base_head: torch.Tensor,
    groups: list[tuple[torch.Tensor, TokenTables]],
    width: int,
) -> torch.Tensor:
    """Logits [N, width] of ``hidden`` [N, H]: the base head's, then each group's rows [r]
    through its tables; columns past a row's vocabulary are -inf.

    ``head(hidden, weight)`` is the model's head on any weight (soft-cap included).
    """
    base = head(hidden, base_head)  # [N, V]
    out = F.pad(base, (0, width - base.shape[1]), value=float("-inf"))  # [N, width]
    for rows, tables in groups:
        if rows.numel() == 0:
            continue
        if tables.head is not None:
            own = head(hidden[rows], tables.head)  # [r, V_a]
            out[rows] = F.pad(own, (0, width - own.shape[1]), value=float("-inf"))
        elif tables.head_ids is not None and tables.head_rows is not None:
            picked = out[rows]  # [r, width]
            picked[:, tables.head_ids] = head(hidden[rows], tables.head_rows)  # [r, k]
            out[rows] = picked
    return out
