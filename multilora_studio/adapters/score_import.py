"""Evaluation scores from outside this project's evaluation (a JSON file a training pipeline
wrote) into the library, where the quality gate and ``adapters list`` read them.

The file holds one object or a list of objects: ``{"prompt_set": NAME, "prompts": N, "checked":
N, "passed": N, "reference_logprob": X | null}`` (``checked`` defaults to ``prompts``); each is
recorded as an evaluation on the adapter's own base, its digest the file's SHA-256.
"""

from __future__ import annotations

import json
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
