"""Chat messages -> token ids, with the special tokens written in message text kept as plain text.

The rendered chat template is tokenized with special tokens parsed, so its own role markers
(``<|im_start|>``) stay control tokens. A message (or tool definition) that spells out a
special token must not forge one: each such spelling is swapped for a placeholder before
rendering, and at tokenization the text between placeholders is tokenized as usual while
each spelling is tokenized as text (``split_special_tokens``), as OpenAI's servers do.
Conversations without such spellings tokenize exactly as before.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

# (tokenizer, messages, **template) -> the rendered text; a sandbox's for an adapter's template
Render = Callable[..., str]


def render_in_process(tokenizer: Any, messages: list[dict[str, Any]], **template: Any) -> str:
    """``tokenizer``'s chat template rendered here: the base model's, trusted with the base."""
    return tokenizer.apply_chat_template(messages, tokenize=False, **template)


def special_token_texts(tokenizer: Any) -> tuple[str, ...]:
    """The tokenizer's special added tokens (control tokens), longest first."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    texts = {
        token.content for token in decoder.values() if getattr(token, "special", False) and token.content
    }
    return tuple(sorted(texts, key=len, reverse=True))


class _Masker:
    """Swaps special-token spellings in strings (nested in lists and dicts) for numbered placeholders."""

    def __init__(self, specials: tuple[str, ...]) -> None:
        self.nonce = uuid.uuid4().hex
        self.found: list[str] = []
        self._pattern = re.compile("|".join(re.escape(text) for text in specials))

    def _swap(self, match: re.Match[str]) -> str:
        self.found.append(match.group(0))
        return f"\ue000{self.nonce}:{len(self.found) - 1}\ue001"

    def mask(self, value: Any) -> Any:
        if isinstance(value, str):
            return self._pattern.sub(self._swap, value)
        if isinstance(value, dict):
            return {key: self.mask(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self.mask(item) for item in value]
        return value

    @property
    def placeholder(self) -> re.Pattern[str]:
        return re.compile(f"\ue000{self.nonce}:(\\d+)\ue001")


def chat_token_ids(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    special_tokens_in_content: bool = False,
    add_special_tokens: bool = False,
    render: Render = render_in_process,
    **template: Any,
) -> list[int]:
    """Token ids of ``messages`` through the chat template (``template``: its keyword arguments,
    such as ``add_generation_prompt`` and ``tools``), rendered by ``render``.

    ``special_tokens_in_content=True`` (trusted local use) lets message text spell control tokens.
    ValueError when the template changed the text so that the placeholders cannot be found.
    """
    specials = () if special_tokens_in_content else special_token_texts(tokenizer)
    masker = _Masker(specials) if specials else None
    if masker is not None:
        messages = masker.mask(messages)
        template = {name: masker.mask(value) for name, value in template.items()}
    text = render(tokenizer, messages, **template)
    if masker is None or not masker.found:
        return list(tokenizer(text, add_special_tokens=add_special_tokens).input_ids)
    pieces = masker.placeholder.split(text)  # text, index, text, index, ..., text
    indices = [int(index) for index in pieces[1::2]]
    if sorted(indices) != list(range(len(masker.found))):
        raise ValueError(
            "the chat template changed message text that spells a special token; send it without one"
        )
    ids: list[int] = []
    for position, piece in enumerate(pieces):
        if position % 2:
            spelled = masker.found[int(piece)]
            ids += tokenizer(spelled, add_special_tokens=False, split_special_tokens=True).input_ids
        elif piece:
            ids += tokenizer(piece, add_special_tokens=False).input_ids
    if add_special_tokens:
        ids = list(tokenizer.build_inputs_with_special_tokens(ids))
    return ids
