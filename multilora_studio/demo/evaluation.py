"""Measuring the demo adapters' behaviour: each adapter and the base on held-out prompts, one batch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from multilora_studio.demo.prompts import chat
from multilora_studio.demo.styles import Style
from multilora_studio.engine import Engine, SamplingParams


@dataclass(frozen=True)
class Evaluation:
    """How often an adapter (and the base model) shows the style's behaviour, with one sample."""

    rate: float
    base_rate: float
    prompts: int
    max_tokens: int
    sample_prompt: str
    sample_answer: str
    base_answer: str


def evaluate(
    engine: Engine, styles: Sequence[Style], prompts: Sequence[str], max_tokens: int
) -> dict[str, Evaluation]:
    """Greedy answers of the base and every style's adapter (already added to ``engine``)."""
    names: list[str | None] = [None, *(style.name for style in styles)]
    requests = [(name, prompt) for name in names for prompt in prompts]
    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    outputs = engine.generate([chat(p) for _, p in requests], [n for n, _ in requests], params)
    texts: dict[str | None, list[str]] = {name: [] for name in names}
    for (name, _), output in zip(requests, outputs, strict=True):
        texts[name].append(output.text)
    results = {}
    for style in styles:
        mine, base = texts[style.name], texts[None]
        results[style.name] = Evaluation(
            rate=sum(map(style.shows, mine)) / len(prompts),
            base_rate=sum(map(style.shows, base)) / len(prompts),
            prompts=len(prompts),
            max_tokens=max_tokens,
            sample_prompt=prompts[0],
            sample_answer=mine[0],
            base_answer=base[0],
        )
    return results
