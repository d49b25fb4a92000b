"""Log-likelihood of a continuation after a prompt, from the engine's prompt log-probabilities.

The prompt is encoded as the engine encodes it (a chat template for messages), the continuation
on its own without special tokens, and the two token lists are scored as one prompt whose
scores start at the continuation (``Continuation.params``): the continuation's log-likelihood is
the sum of its tokens' entries, and the prompt's KV comes from the prefix cache once one request
of the same adapter has computed it (each choice of a question shares it).
"""

from __future__ import annotations

from dataclasses import dataclass

from multilora_studio.engine import RequestOutput, SamplingParams, ServingEngine


@dataclass(frozen=True)
class Continuation:
    """``token_ids`` = the prompt's ids then the continuation's; the continuation starts at ``start``."""

    text: str
    token_ids: list[int]
    start: int

    @property
    def params(self) -> SamplingParams:
        """Score the continuation's tokens only: nothing generated, the prompt's KV reusable."""
        return SamplingParams(max_tokens=0, prompt_logprobs=0, prompt_logprobs_start=self.start)


def continuation(
    engine: ServingEngine, context_ids: list[int], text: str, adapter: str | None = None
) -> Continuation:
    """The scored prompt of ``text`` after ``context_ids`` (tokenized as ``adapter``'s requests
    are); ValueError when it is empty or too long."""
    tokenizer = engine.tokenizer_for(adapter)
    if tokenizer is None:
        raise ValueError("this model has no tokenizer; references and choices need one")
    ids = list(tokenizer(text, add_special_tokens=False).input_ids)
    if not ids:
        raise ValueError(f"the continuation {text!r} has no tokens")
    total = len(context_ids) + len(ids)
    if total >= engine.config.max_model_len:
        raise ValueError(
            f"prompt and continuation {text[:40]!r} have {total} tokens; max_model_len is "
            f"{engine.config.max_model_len}"
        )
    return Continuation(text, [*context_ids, *ids], len(context_ids))


def summed_logprob(output: RequestOutput, start: int) -> float:
    """Sum of the scored prompt's log-probabilities from position ``start`` on."""
    entries = output.prompt_logprobs
    if entries is None:
        raise RuntimeError(f"request {output.request_id} came back without prompt log-probabilities")
    return sum(entry.logprob for entry in entries[start:] if entry is not None)
