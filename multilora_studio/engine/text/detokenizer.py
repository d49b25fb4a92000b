"""Incremental detokenization with stop strings, for streaming text deltas."""

from __future__ import annotations

from typing import Any


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas.

    Decodes only a short window (from ``prefix_offset``) per token, and holds back a
    trailing incomplete UTF-8 sequence and the last ``len(longest stop) - 1`` characters,
    so no delta is ever retracted when a stop string completes later. When the request
    finishes, whatever is still held back is flushed, so the final text is the decode of
    all ids (cut before the first stop string). Stop strings are looked for only once
    ``min_tokens`` ids have come (vLLM's rule: text before that never stops the request).
    """

    def __init__(self, tokenizer: Any, stop: tuple[str, ...], min_tokens: int = 0) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.min_tokens = min_tokens
        self.holdback = max((len(s) for s in stop), default=1) - 1
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.text = ""
        self.emitted = 0
        self.stopped = False

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _advance(self, final: bool) -> bool:
        """Move newly decodable text into ``text``; True when a stop string has appeared."""
        before = len(self.text)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and (final or not full.endswith("\ufffd")):
            self.text += full[len(prefix) :]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        if not self.stop or len(self.ids) < self.min_tokens:
            return False
        start = max(0, before - self.holdback)  # a stop string may straddle old and new text
        hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            self.stopped = True
        return self.stopped

    def add(self, token_id: int) -> bool:
        """Append one token; True when a stop string has appeared (text is cut before it)."""
        if self.stopped:
            return True
        self.ids.append(token_id)
        return self._advance(final=False)

    def delta(self, finished: bool) -> str:
        """Text not yet emitted (all of it, including an incomplete character, when ``finished``)."""
        if finished and not self.stopped and self.read_offset < len(self.ids):
            self._advance(final=True)
        end = len(self.text) if finished else max(self.emitted, len(self.text) - self.holdback)
        piece = self.text[self.emitted : end]
        self.emitted = end
        return piece
