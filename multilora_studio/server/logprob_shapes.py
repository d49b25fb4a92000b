"""Engine log-probabilities in the API's JSON shapes: OpenAI's completions and chat, vLLM's prompt_logprobs.

Log-probabilities of the raw logits (before temperature, top-k, top-p), as OpenAI reports
them; -inf becomes -9999.0 as in vLLM (JSON has no infinity).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from multilora_studio.engine import TokenLogprob
from multilora_studio.server.token_text import TokenNamer

FLOOR = -9999.0

# One scored position: the token's id and its log-probability (None: the first prompt token).
Scored = tuple[int, TokenLogprob | None]


@dataclass(frozen=True)
class ScoreOptions:
    """What a request asked to get back beside the text."""

    logprobs: int | None = None  # alternatives per generated token; None: no logprobs object
    prompt_logprobs: int | None = None  # vLLM's prompt_logprobs: alternatives per prompt token
    echo: bool = False  # completions: the prompt (text and scored tokens) before the completion
    token_ids: bool = False  # vLLM's return_tokens_as_token_ids: tokens named ``token_id:<id>``


def _value(logprob: float) -> float:
    return max(logprob, FLOOR)


def completion_logprobs(scored: Sequence[Scored], top: int, name: TokenNamer, offset: int) -> dict[str, Any]:
    """OpenAI's legacy ``{tokens, token_logprobs, top_logprobs, text_offset}``.

    Each ``top_logprobs`` entry maps the ``top`` most likely tokens' text, then the chosen
    token's, to their log-probabilities. ``text_offset`` counts the characters of the tokens'
    text from ``offset`` (vLLM's way).
    """
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offset: list[int] = []
    for token_id, entry in scored:
        token = name(token_id)
        tokens.append(token)
        text_offset.append(offset)
        offset += len(token)
        if entry is None:
            token_logprobs.append(None)
            top_logprobs.append(None)
            continue
        token_logprobs.append(_value(entry.logprob))
        alternatives = {name(other): _value(logprob) for other, logprob in entry.top[:top]}
        alternatives.setdefault(token, _value(entry.logprob))
        top_logprobs.append(alternatives)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": text_offset,
    }


def _chat_token(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": _value(logprob), "bytes": list(token.encode("utf-8", "replace"))}


def chat_logprobs(entries: Sequence[TokenLogprob], top: int, name: TokenNamer) -> dict[str, Any]:
    """OpenAI's chat ``{"content": [{token, logprob, bytes, top_logprobs}]}``, ``top`` most likely first."""
    content = []
    for entry in entries:
        item = _chat_token(name(entry.token_id), entry.logprob)
        item["top_logprobs"] = [_chat_token(name(other), lp) for other, lp in entry.top[:top]]
        content.append(item)
    return {"content": content}


def prompt_logprobs(
    entries: Sequence[TokenLogprob | None], top: int, name: TokenNamer
) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's ``[null, {"<token id>": {logprob, rank, decoded_token}}, ...]``: the token, then the top."""
    shaped: list[dict[str, dict[str, Any]] | None] = []
    for entry in entries:
        if entry is None:
            shaped.append(None)
            continue
        ranked = {str(entry.token_id): _ranked(entry.token_id, entry.logprob, entry.rank, name)}
        for rank, (other, logprob) in enumerate(entry.top[:top], 1):
            ranked.setdefault(str(other), _ranked(other, logprob, rank, name))
        shaped.append(ranked)
    return shaped


def _ranked(token_id: int, logprob: float, rank: int, name: TokenNamer) -> dict[str, Any]:
    return {"logprob": _value(logprob), "rank": rank, "decoded_token": name(token_id)}
