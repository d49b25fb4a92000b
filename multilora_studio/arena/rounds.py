"""A round of the arena: one prompt answered by two contenders in ONE batched engine run, both
with the same sampling settings and the same recorded seed; and where the prompts come from."""

from __future__ import annotations

import json
import secrets
import threading
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from multilora_studio.arena.votes import PERSON, Vote
from multilora_studio.engine import MAX_SEED, Prompt, SamplingParams, ServingEngine
from multilora_studio.evaluate.prompt_set import load_prompt_set
from multilora_studio.evaluate.runner import wait_all
from multilora_studio.run_records import BASE, AdapterDigests


@dataclass(frozen=True)
class ArenaSettings:
    """How both sides of every round sample; ``chat`` sends text prompts as one user message."""

    max_tokens: int = 128
    temperature: float = 0.7
    top_p: float = 1.0
    chat: bool = True

    def __post_init__(self) -> None:
        self.sampling_params(0)  # SamplingParams checks the values

    def sampling_params(self, seed: int) -> SamplingParams:
        return SamplingParams(
            max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p, seed=seed
        )

    def prompt_of(self, text: Prompt) -> Prompt:
        return [{"role": "user", "content": text}] if self.chat and isinstance(text, str) else text


@dataclass(frozen=True)
class Round:
    """Two answers to one prompt: ``left`` is shown as A, ``right`` as B."""

    id: str
    prompt: str
    left: str
    right: str
    output_left: str
    output_right: str
    settings: dict[str, Any]  # ArenaSettings with the seed both sides used
    base_digest: str
    digest_left: str
    digest_right: str

    def vote(self, verdict: str, voter: str = PERSON) -> Vote:
        return Vote(
            round_id=self.id,
            prompt=self.prompt,
            left=self.left,
            right=self.right,
            output_left=self.output_left,
            output_right=self.output_right,
            verdict=verdict,
            settings=self.settings,
            base_digest=self.base_digest,
            digest_left=self.digest_left,
            digest_right=self.digest_right,
            voter=voter,
        )


def run_round(
    engine: ServingEngine,
    prompt: Prompt,
    left: str,
    right: str,
    settings: ArenaSettings,
    digests: AdapterDigests,
    cancel: threading.Event | None = None,
) -> Round:
    """``prompt`` through ``left`` and ``right`` (``'base'``: no adapter) submitted together."""
    seed = secrets.randbelow(MAX_SEED + 1)
    params = settings.sampling_params(seed)
    sent = settings.prompt_of(prompt)
    requests = [(sent, None if name == BASE else name, params) for name in (left, right)]
    outputs = wait_all(engine, engine.submit_many(requests), cancel, None, 0, len(requests))
    folders = {info.name: info.path for info in engine.list_adapters()}

    def digest(name: str) -> str:
        return "" if name == BASE else digests.of(Path(folders[name]))

    return Round(
        id=uuid.uuid4().hex,
        prompt=prompt if isinstance(prompt, str) else json.dumps(prompt, ensure_ascii=False),
        left=left,
        right=right,
        output_left=outputs[0].text,
        output_right=outputs[1].text,
        settings={**asdict(settings), "seed": seed},
        base_digest=engine.base_digest,
        digest_left=digest(left),
        digest_right=digest(right),
    )


def typed_prompts(text: str) -> list[str]:
    """Typed prompts: one per non-empty line."""
    return [line.strip() for line in text.splitlines() if line.strip()]


def prompt_set_prompts(path: Path) -> list[Prompt]:
    """The prompts of an Evaluate prompt set (its references and checks are not used)."""
    return [case.prompt for case in load_prompt_set(path).cases]


def check_contenders(engine: ServingEngine, names: Sequence[str]) -> list[str]:
    """``names`` once each, every one served by ``engine`` (or ``'base'``), at least two."""
    chosen = list(dict.fromkeys(name.strip() for name in names if name.strip()))
    known = {info.name for info in engine.list_adapters()}
    unknown = [name for name in chosen if name != BASE and name not in known]
    if unknown:
        served = ", ".join(sorted(known)) or "no adapters"
        raise ValueError(f"unknown contenders {', '.join(unknown)}; the engine serves {served}")
    if len(chosen) < 2:
        raise ValueError(f"pick at least two contenders (adapters, or '{BASE}' and an adapter)")
    return chosen
