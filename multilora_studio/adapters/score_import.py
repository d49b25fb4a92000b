"""Evaluation scores from outside this project's evaluation into the library, where the quality
gate and ``adapters list`` read them: a JSON file a training pipeline wrote, or a Hugging Face
model card.

The JSON file holds one object or a list of objects: ``{"prompt_set": NAME, "prompts": N,
"checked": N, "passed": N, "reference_logprob": X | null}`` (``checked`` defaults to
``prompts``). A model card's YAML front matter may hold a ``model-index``: per result a task, a
dataset and metrics with a type and a value (parsed by ``huggingface_hub``'s ``ModelCard``);
each metric becomes a score with that metric and value and no counts (the card gives none).
Either is recorded as an evaluation on the adapter's own base, its digest the file's SHA-256.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from multilora_studio.adapters.library_errors import LibraryError
from multilora_studio.adapters.registry_schema import EvalScoreRecord
from multilora_studio.util import sha256_file


def read_scores(path: Path, adapter: str, base_digest: str) -> list[EvalScoreRecord]:
    """The scores of ``path`` for ``adapter``; LibraryError naming what is wrong."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise LibraryError(f"{path}: not a readable JSON file ({error})") from None
    entries = data if isinstance(data, list) else [data]
    digest, now = sha256_file(path), time.time()
    scores = []
    for number, entry in enumerate(entries, 1):
        where = f"{path} entry {number}"
        if not isinstance(entry, dict) or not isinstance(entry.get("prompt_set"), str):
            raise LibraryError(f"{where}: needs an object with a prompt_set name")
        raw = {key: entry.get(key, entry.get("prompts")) for key in ("prompts", "checked", "passed")}
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in raw.values()):
            raise LibraryError(f"{where}: prompts, checked and passed must be counts (whole numbers >= 0)")
        prompts, checked, passed = (int(raw[key]) for key in ("prompts", "checked", "passed"))  # type: ignore[arg-type]
        if not passed <= checked <= prompts:
            raise LibraryError(
                f"{where}: needs passed <= checked <= prompts, got {passed}, {checked}, {prompts}"
            )
        logprob = entry.get("reference_logprob")
        if logprob is not None and not isinstance(logprob, (int, float)):
            raise LibraryError(f"{where}: reference_logprob must be a number or null")
        name = entry["prompt_set"]
        scores.append(
            EvalScoreRecord(
                adapter, name, digest, base_digest, prompts, checked, passed, logprob, str(path), now
            )
        )
    return scores


def read_model_card(
    path: Path, adapter: str, base_digest: str, shown_path: Path | None = None
) -> list[EvalScoreRecord]:
    """The metrics of the model card ``path``'s ``model-index`` as scores without counts (none
    for a card without one); LibraryError naming what is wrong. ``shown_path``: the card's path
    to record (default ``path``)."""
    import yaml  # with the Hub client (0.15 s of imports): not to read the library
    from huggingface_hub import ModelCard, ModelCardData

    try:
        card = ModelCard(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise LibraryError(f"{path}: not a readable model card ({error})") from None
    except (ValueError, yaml.YAMLError) as error:  # the front matter or its model-index is malformed
        first = str(error).splitlines()[0]
        raise LibraryError(f"{path}: its model-index cannot be read ({first})") from None
    digest, now = sha256_file(path), time.time()
    scores = []
    results = card.data.eval_results if isinstance(card.data, ModelCardData) else None
    for result in results or ():
        number = as_number(result.metric_value)
        if number is None:
            raise LibraryError(
                f"{path}: {result.dataset_name} {result.metric_type}: {result.metric_value!r} is not a number"
            )
        where = ", ".join(part for part in (result.dataset_config, result.dataset_split) if part)
        prompt_set = f"{result.dataset_name} ({where})" if where else result.dataset_name
        scores.append(
            EvalScoreRecord(
                adapter, prompt_set, digest, base_digest, None, None, None, None,
                str(shown_path or path), now, result.metric_type, number,
            )
        )  # fmt: skip
    return scores


def as_number(value: object) -> float | None:
    """``value`` as a finite float (a number, or a string that spells one), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None
