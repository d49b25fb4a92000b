"""The base's vocabulary side that an adapter's embedding / LM-head tensors are checked against."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VocabShape:
    """What the vocabulary side is checked against: the base's vocabulary, width and tying."""

    vocab_size: int
    hidden_size: int
    tied: bool
