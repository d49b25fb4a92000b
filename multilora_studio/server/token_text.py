"""Token ids -> the text the API reports: each id decoded on its own (vLLM's way), cached."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

TokenNamer = Callable[[int], str]


def id_name(token_id: int) -> str:
    """vLLM's ``return_tokens_as_token_ids`` form of a token."""
    return f"token_id:{token_id}"


class TokenText:
    """Decodes with the engine's tokenizer; a model without one names tokens as ``token_id:<id>``."""

    def __init__(self, tokenizer: Any | None) -> None:
        self.tokenizer = tokenizer
        self._tokens: dict[int, str] = {}  # at most one entry per vocabulary id

    def token(self, token_id: int) -> str:
        text = self._tokens.get(token_id)
        if text is None:
            text = id_name(token_id) if self.tokenizer is None else self.tokenizer.decode([token_id])
            self._tokens[token_id] = text
        return text

    def text(self, token_ids: Sequence[int]) -> str:
        """The text of a whole sequence (what ``echo`` returns for a prompt given as ids)."""
        if self.tokenizer is None:
            return "".join(self.token(token_id) for token_id in token_ids)
        return self.tokenizer.decode(list(token_ids))

    def namer(self, as_ids: bool) -> TokenNamer:
        """How tokens are named in log-probabilities: decoded, or ``token_id:<id>`` when ``as_ids``."""
        return id_name if as_ids else self.token
