"""An evaluation's results: one cell per prompt and adapter, the per-adapter scores (plain data)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

from multilora_studio.run_records import EngineRecord


@dataclass(frozen=True)
class Cell:
    """One prompt through one adapter.

    ``passed`` is None when the prompt has no check; ``chosen`` is the choice a choice check
    picked; ``reference_logprob`` sums the reference's token log-probabilities after the prompt
    (``reference_tokens`` of them; None without a reference).
    """

    prompt: int  # index into EvalResults.prompts
    adapter: str
    output: str
    tokens: int
    finish_reason: str | None
    passed: bool | None = None
    chosen: str | None = None
    reference_logprob: float | None = None
    reference_tokens: int = 0


@dataclass(frozen=True)
class AdapterScore:
    """One adapter over the set: passes of the checked prompts, reference log-probability per token."""

    adapter: str
    prompts: int
    checked: int
    passed: int
    reference_logprob_per_token: float | None

    @property
    def pass_rate(self) -> float | None:
        return self.passed / self.checked if self.checked else None


@dataclass(frozen=True)
class PromptRow:
    """One prompt as the results record it (what a drill-down shows above the outputs)."""

    row: int
    prompt: str
    chat: bool
    reference: str | None
    check: dict[str, Any] | None


@dataclass
class EvalResults:
    """Everything one run produced and what is needed to rerun it.

    ``settings`` are ``EvalSettings.to_dict()`` (the seed a sampled run used, or ``greedy``);
    ``adapter_digests`` the SHA-256 of each adapter's weights and ``adapter_folders`` where the
    engine read them; ``engine`` is how the engine ran. Files saved before these were kept
    read back with None / empty values (``prompt_set_path`` "").
    """

    prompt_set: str
    prompt_set_digest: str
    model: str
    base_digest: str
    adapters: list[str]
    settings: dict[str, Any]
    prompts: list[PromptRow]
    cells: list[Cell]
    created: float
    scores: list[AdapterScore] = field(default_factory=list)
    engine: EngineRecord | None = None
    adapter_digests: dict[str, str] = field(default_factory=dict)
    adapter_folders: dict[str, str] = field(default_factory=dict)
    prompt_set_path: str = ""
    default_check: dict[str, Any] | None = None

    def cell(self, prompt: int, adapter: str) -> Cell:
        return self._by_key[(prompt, adapter)]

    def row_cells(self, prompt: int) -> list[Cell]:
        """One prompt's cells in the order of ``adapters`` (the drill-down)."""
        return [self.cell(prompt, adapter) for adapter in self.adapters]

    def score(self, adapter: str) -> AdapterScore:
        (found,) = (score for score in self.scores if score.adapter == adapter)
        return found

    @cached_property
    def _by_key(self) -> dict[tuple[int, str], Cell]:
        """The cells by (prompt, adapter), built once (the results are not changed after a run)."""
        return {(cell.prompt, cell.adapter): cell for cell in self.cells}

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for item, score in zip(data["scores"], self.scores, strict=True):
            item["pass_rate"] = score.pass_rate
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalResults:
        scores = [
            AdapterScore(**{k: v for k, v in item.items() if k != "pass_rate"}) for item in data["scores"]
        ]
        engine = data.get("engine")
        return cls(
            prompt_set=data["prompt_set"],
            prompt_set_digest=data["prompt_set_digest"],
            model=data["model"],
            base_digest=data["base_digest"],
            adapters=list(data["adapters"]),
            settings=dict(data["settings"]),
            prompts=[PromptRow(**item) for item in data["prompts"]],
            cells=[Cell(**item) for item in data["cells"]],
            created=data["created"],
            scores=scores,
            engine=None if engine is None else EngineRecord(**engine),
            adapter_digests=dict(data.get("adapter_digests", {})),
            adapter_folders=dict(data.get("adapter_folders", {})),
            prompt_set_path=data.get("prompt_set_path", ""),
            default_check=data.get("default_check"),
        )


def adapter_scores(adapters: list[str], cells: list[Cell]) -> list[AdapterScore]:
    """Per-adapter pass counts and the token-weighted mean log-probability of the references."""
    scores = []
    for adapter in adapters:
        mine = [cell for cell in cells if cell.adapter == adapter]
        checked = [cell for cell in mine if cell.passed is not None]
        tokens = sum(cell.reference_tokens for cell in mine if cell.reference_logprob is not None)
        total = sum(cell.reference_logprob for cell in mine if cell.reference_logprob is not None)
        scores.append(
            AdapterScore(
                adapter=adapter,
                prompts=len(mine),
                checked=len(checked),
                passed=sum(bool(cell.passed) for cell in checked),
                reference_logprob_per_token=total / tokens if tokens else None,
            )
        )
    return scores
