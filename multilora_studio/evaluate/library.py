"""An evaluation's per-adapter scores into the adapter library (the base and unlisted adapters skipped)."""

from __future__ import annotations

from pathlib import Path

from multilora_studio.adapters.registry import Registry
from multilora_studio.adapters.registry_schema import EvalScoreRecord
from multilora_studio.evaluate.results import EvalResults
from multilora_studio.run_records import BASE


def score_record(results: EvalResults, adapter: str, results_path: Path | None = None) -> EvalScoreRecord:
    """The library's line of ``adapter``'s score in ``results`` (saved at ``results_path``)."""
    score = results.score(adapter)
    return EvalScoreRecord(
        adapter=adapter,
        prompt_set=results.prompt_set,
        prompt_set_digest=results.prompt_set_digest,
        base_digest=results.base_digest,
        prompts=score.prompts,
        checked=score.checked,
        passed=score.passed,
        reference_logprob=score.reference_logprob_per_token,
        results_path=None if results_path is None else str(results_path),
        created=results.created,
    )


def record_scores(registry: Registry, results: EvalResults, results_path: Path | None = None) -> list[str]:
    """Record the scores of every evaluated adapter the library holds (one transaction); their names."""
    scores = [
        score_record(results, score.adapter, results_path)
        for score in results.scores
        if score.adapter != BASE and registry.find(score.adapter) is not None
    ]
    registry.record_eval_scores(scores)
    return [score.adapter for score in scores]
