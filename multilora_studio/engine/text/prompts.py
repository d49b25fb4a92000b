"""What a request's prompt may be, and its token ids."""

from __future__ import annotations

from typing import Any

from multilora_studio.engine.text.chat_tokens import Render, chat_token_ids, render_in_process

Prompt = str | list[int] | list[dict[str, str]]  # text, token ids, or chat messages


def encode_prompt(
    prompt: Any,
    tokenizer: Any | None,
    vocab_size: int,
    special_tokens_in_content: bool = False,
    model: str = "this model",
    render: Render = render_in_process,
) -> list[int]:
    """Token ids of a text prompt, chat messages (through the chat template) or ids as given.

    Special tokens spelled in a chat message's text stay text unless ``special_tokens_in_content``
    (chat_tokens.py); a text prompt is the caller's whole prompt, its special tokens parsed.
    ``model`` names the model (its folder) in the error for a prompt without a tokenizer; ``render``
    renders the chat template (``chat_tokens.Render``).
    """
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError(f"{model} has no tokenizer (no tokenizer files); pass token ids")
        return list(tokenizer(prompt).input_ids)
    if isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
        if tokenizer is None:
            raise ValueError(f"{model} has no tokenizer (no tokenizer files); pass token ids")
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("this model has no chat template; pass a plain prompt")
        for message in prompt:
            if not isinstance(message.get("role"), str) or not isinstance(message.get("content"), str):
                raise ValueError("each chat message needs string 'role' and 'content' fields")
        return chat_token_ids(
            tokenizer, prompt, special_tokens_in_content, render=render, add_generation_prompt=True
        )
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        bad = [t for t in prompt if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"token ids out of range [0, {vocab_size}): {bad[:5]}")
        return list(prompt)
    raise ValueError("a prompt is a string, a list of token ids or a list of chat messages")
