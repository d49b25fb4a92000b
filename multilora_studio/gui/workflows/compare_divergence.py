"""Token divergence of Compare's last answers from their bases: which answers are scored, and the
scoring itself (one batch per base, under a lease of the base; run off the GUI thread)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from multilora_studio.deploy import BasePool
from multilora_studio.divergence import DivergenceRequest, TokenDivergence, score_divergence
from multilora_studio.engine import ServingEngine
from multilora_studio.gui.compare_export import Comparison
from multilora_studio.gui.workflows.compare_answers import AnswerState
from multilora_studio.run_records import column_choice

Lease = Callable[[str], AbstractContextManager[ServingEngine]]
Scored = list[tuple[int, list[TokenDivergence], Callable[[int], str]]]  # column, its tokens, a decoder


@dataclass(frozen=True)
class DivergenceScoring:
    """The answers one scoring explains: (column, its base, what to score), for the comparison shown
    when it began (its results are dropped once a newer run replaced it), on ``pool``."""

    pool: BasePool
    comparison: Comparison | None
    wanted: list[tuple[int, str, DivergenceRequest]]

    def score(self, lease: Lease) -> Scored:
        """Each wanted answer's tokens under its adapter and its base; answers with tokens the base
        lacks (added tokens) have no base score and are left out."""
        found: Scored = []
        for base in dict.fromkeys(base for _, base, _ in self.wanted):
            with lease(base) as engine:
                vocab = engine.spec.vocab_size
                group = [
                    (index, request)
                    for index, on, request in self.wanted
                    if on == base and max([*request.prompt_token_ids, *request.output_token_ids]) < vocab
                ]
                results = score_divergence(engine, [request for _, request in group]) if group else []
                found += [
                    (index, tokens, decoder(engine, request.adapter))
                    for (index, request), tokens in zip(group, results, strict=True)
                ]
        return found


def divergence_wanted(
    answers: list[AnswerState], bases: list[str]
) -> list[tuple[int, str, DivergenceRequest]]:
    """Every adapter column's finished answer with tokens, at the column's strength, on its base."""
    wanted = []
    for index, (answer, base) in enumerate(zip(answers, bases, strict=True)):
        output = answer.output
        if not answer.reference and output is not None and output.token_ids:
            adapter, scale = column_choice(answer.name)
            wanted.append(
                (index, base, DivergenceRequest(output.prompt_token_ids, output.token_ids, adapter, scale))
            )
    return wanted


def decoder(engine: ServingEngine, adapter: str | None) -> Callable[[int], str]:
    """A token id's text under ``adapter``'s tokenizer (its token name where the text is not whole)."""
    tokenizer = engine.tokenizer_for(adapter)

    def decode(token_id: int) -> str:
        if tokenizer is None:
            return f"<{token_id}>"
        text = tokenizer.decode([token_id])
        return text if "\ufffd" not in text else str(tokenizer.convert_ids_to_tokens(token_id))

    return decode
