"""Token-level divergence: how much more (or less) likely each output token is under an adapter than the base.

Plain Python over the engine (no Qt), for the Compare view and any other reader: every
prompt + output is scored twice, under the base and under its adapter, in one
``Engine.score`` batch; each output token gets both log-probabilities and both top lists.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from multilora_studio.engine import ServingEngine, TokenLogprob

TOP_ALTERNATIVES = 5


@dataclass(frozen=True)
class DivergenceRequest:
    """One output to explain: the prompt it answered, its tokens and the adapter that wrote them."""

    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    adapter: str | None
    adapter_scale: float = 1.0  # the strength it was written at


@dataclass(frozen=True)
class TokenDivergence:
    """One output token under the adapter and the base (natural-log probabilities)."""

    token_id: int
    text: str
    logprob: float  # under the adapter
    base_logprob: float
    top: tuple[tuple[int, float], ...]  # the adapter's most likely tokens here, most likely first
    base_top: tuple[tuple[int, float], ...]

    @property
    def delta(self) -> float:
        """log p_adapter(token) - log p_base(token): > 0 where the adapter makes it more likely."""
        return self.logprob - self.base_logprob


def token_pieces(tokenizer: Any | None, token_ids: Sequence[int]) -> list[str]:
    """The text each token adds to the decoded output (multi-byte characters go to their last token)."""
    if tokenizer is None:
        return [f"<{token}>" for token in token_ids]
    pieces, previous = [], ""
    for end in range(1, len(token_ids) + 1):
        text = tokenizer.decode(list(token_ids[:end]), skip_special_tokens=False)
        if text.endswith("\ufffd"):  # an incomplete character: it shows with the next token
            pieces.append("")
            continue
        pieces.append(text[len(previous) :])
        previous = text
    return pieces


def score_divergence(
    engine: ServingEngine, requests: Sequence[DivergenceRequest], top_k: int = TOP_ALTERNATIVES
) -> list[list[TokenDivergence]]:
    """Each request's output tokens under its adapter and the base, from one batched scoring pass."""
    sequences = [list(r.prompt_token_ids) + list(r.output_token_ids) for r in requests]
    prompts: list[list[int]] = [ids for ids in sequences for _ in range(2)]
    adapters = [name for r in requests for name in (r.adapter, None)]
    scales = [scale for r in requests for scale in (r.adapter_scale, 1.0)]
    scored = engine.score(prompts, adapters, top_k, scales)
    for output in scored:
        if output.error:
            raise ValueError(f"scoring failed: {output.error}")
    results = []
    for index, request in enumerate(requests):
        under_adapter, under_base = scored[2 * index].prompt_logprobs, scored[2 * index + 1].prompt_logprobs
        assert under_adapter is not None and under_base is not None  # asked for with top_k
        start = len(request.prompt_token_ids)
        pieces = token_pieces(engine.tokenizer_for(request.adapter), request.output_token_ids)
        tokens = []
        for offset, token in enumerate(request.output_token_ids):
            adapter_entry: TokenLogprob | None = under_adapter[start + offset]
            base_entry: TokenLogprob | None = under_base[start + offset]
            assert adapter_entry is not None and base_entry is not None  # only position 0 has none
            tokens.append(
                TokenDivergence(
                    token,
                    pieces[offset],
                    adapter_entry.logprob,
                    base_entry.logprob,
                    adapter_entry.top,
                    base_entry.top,
                )
            )
        results.append(tokens)
    return results
