"""Evaluation scores from outside this project's evaluation into the library, where the quality
gate and ``adapters list`` read them: a JSON file a training pipeline wrote, or a Hugging Face
model card.

The JSON file holds one object or a list of objects: ``{"prompt_set": NAME, "prompts": N,
"checked": N, "passed": N, "reference_logprob": X | null}`` (``checked`` defaults to
``prompts``). A model card's YAML front matter may hold a ``model-index``: per result a task, a
dataset and metrics with a type and a value (parsed by ``huggingface_hub``'s ``ModelCard``);
each metric becomes a score with that metric and value and no counts (the card gives none).
Either is recorded as an evaluation on the adapter's own base, its digest the file's SHA-256.
A model card is read as every file an adapter brings is (``adapter_files``), at most
``MAX_MODEL_CARD_BYTES`` of it; front matter with YAML aliases, and a model-index of more than
``MAX_CARD_SCORES`` metrics, are refused whole.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path

from multilora_studio.adapters.adapter_files import AdapterError, read_adapter_file
from multilora_studio.adapters.library_errors import LibraryError
from multilora_studio.adapters.registry_schema import EvalScoreRecord
from multilora_studio.util import sha256_file

MODEL_CARD = "README.md"  # a pulled or imported adapter's model card: its model-index becomes scores
MAX_MODEL_CARD_BYTES = 1 << 20  # the Hub's cards are a few KB to ~300 KB (a large benchmark table)
MAX_CARD_SCORES = 1000  # the metrics recorded of one card: a leaderboard card has 6 to a few hundred


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
    from huggingface_hub import ModelCardData
    from huggingface_hub.repocard import REGEX_YAML_BLOCK

    try:
        data = read_adapter_file(path, MAX_MODEL_CARD_BYTES)
        front = REGEX_YAML_BLOCK.search(data.decode("utf-8"))
    except (AdapterError, UnicodeDecodeError) as error:
        raise LibraryError(f"{path}: not a readable model card ({error})") from None
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: 20x faster than PyYAML's own
    try:
        if front is not None and any(isinstance(e, yaml.AliasEvent) for e in yaml.parse(front[2], loader)):
            raise LibraryError(
                f"{path}: its front matter uses YAML aliases (*name), which can repeat one entry "
                "millions of times; write each result out"
            )
        metadata = (yaml.load(front[2], loader) if front is not None else None) or {}
        if not isinstance(metadata, dict):
            raise ValueError("repo card metadata block should be a dict")
        results = ModelCardData(**metadata).eval_results or []
    except LibraryError:
        raise
    except (ValueError, TypeError, yaml.YAMLError) as error:  # malformed front matter or model-index
        first = str(error).splitlines()[0]
        raise LibraryError(f"{path}: its model-index cannot be read ({first})") from None
    if len(results) > MAX_CARD_SCORES:
        raise LibraryError(
            f"{path}: its model-index holds {len(results)} metrics; the library records at most "
            f"{MAX_CARD_SCORES} of a model card"
        )
    digest, now = hashlib.sha256(data).hexdigest(), time.time()
    scores = []
    for result in results:
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
