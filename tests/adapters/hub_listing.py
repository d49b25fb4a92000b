"""The Hub's model search (``GET /api/models``) for the test Hub, answered as the Hub answers it.

olah has no listing route, so the test harness answers it from ``hub_records/`` (its README
says where each file comes from): ``recorded.json`` holds real Hub records, listed as
recorded (found by search, not pullable from the test Hub); ``test_repos.json`` holds what
only the Hub knows about the test Hub's own repositories (``_id``, downloads, likes,
trendingScore, createdAt, pipeline_tag), and each repository gives the rest, as on the Hub:
the tags from its model card and files, author, sha and lastModified of its head commit, its
files. A repository of the test Hub without counts there has zero counts.

The query follows the Hub (its API docs, and huggingface_hub 1.x, which no longer sends
``direction``): ``search`` is a case-insensitive substring of the id, ``author`` the owner,
each ``filter`` a tag that must be present; ``sort`` one of the fields below, descending
(the only direction the Hub allows for all but createdAt, where ``direction`` other than -1
sorts ascending), an entry without the field (recorded model pages carry no trendingScore)
as 0; without ``sort``, trending first; ``limit`` at most 1000 (one page). Without ``full``
or ``expand`` an entry has the Hub's default fields only.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

RECORDS = Path(__file__).with_name("hub_records")
RECORDED = RECORDS / "recorded.json"
TEST_REPO_COUNTS = RECORDS / "test_repos.json"
DEFAULT_FIELDS = (
    "_id", "id", "likes", "trendingScore", "private", "downloads", "tags", "pipeline_tag",
    "library_name", "createdAt", "modelId",
)  # fmt: skip
SORTS = ("downloads", "likes", "trendingScore", "lastModified", "createdAt")
ASCENDING_ALLOWED = ("createdAt",)
MAX_LIMIT = 1000


class BadQuery(ValueError):
    """A query the Hub answers with 400."""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def _card(repo: Path) -> dict:
    import yaml

    try:
        text = _git(repo, "show", "HEAD:README.md")
    except subprocess.CalledProcessError:
        return {}
    if not text.startswith("---"):
        return {}
    card = yaml.safe_load(text.split("---", 2)[1]) or {}
    return card if isinstance(card, dict) else {}


def hub_time(stamp: int) -> str:
    """The Hub's timestamp format (UTC, milliseconds, Z)."""
    return datetime.fromtimestamp(stamp, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def hub_tags(card: dict, files: list[str]) -> list[str]:
    """Tags the Hub derives from a model card and the files beside it."""
    library = card.get("library_name")
    tags = [str(library)] if library else []
    if any(name.endswith(".safetensors") for name in files):
        tags.append("safetensors")
    tags.extend(str(tag) for tag in card.get("tags") or [])
    bases = card.get("base_model") or []
    for base in [bases] if isinstance(bases, str) else bases:
        tags.append(f"base_model:{base}")
        if "adapter_config.json" in files:
            tags.append(f"base_model:adapter:{base}")
    return [*dict.fromkeys(tags), "region:us"]


def local_entry(repo: Path, counts: dict[str, Any] | None) -> dict[str, Any]:
    """The full listing entry of a repository under ``<mirrors>/models/<org>/<name>``."""
    repo_id = f"{repo.parent.name}/{repo.name}"
    card = _card(repo)
    files = _git(repo, "ls-tree", "--name-only", "HEAD").split()
    commit_times = _git(repo, "log", "--format=%ct").split()
    entry: dict[str, Any] = {
        "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24],
        "downloads": 0,
        "likes": 0,
        "trendingScore": 0,
        "private": False,
        "createdAt": hub_time(int(commit_times[-1])),
        "pipeline_tag": None,
        **(counts or {}),
    }
    entry.update(
        id=repo_id,
        modelId=repo_id,
        author=repo.parent.name,
        gated=False,
        sha=_git(repo, "rev-parse", "HEAD").strip(),
        lastModified=hub_time(int(commit_times[0])),
        tags=hub_tags(card, files),
        library_name=card.get("library_name"),
        siblings=[{"rfilename": name} for name in sorted([".gitattributes", *files])],
    )
    return entry


def all_models(mirrors: list[Path]) -> list[dict[str, Any]]:
    """Every repository the test Hub holds, then the recorded Hub records."""
    counts = {entry["id"]: entry for entry in json.loads(TEST_REPO_COUNTS.read_text())}
    models = [
        local_entry(repo, counts.get(f"{repo.parent.name}/{repo.name}"))
        for mirror in mirrors
        for repo in sorted((mirror / "models").glob("*/*"))
        if (repo / ".git").exists()
    ]
    return models + json.loads(RECORDED.read_text())


def search(
    models: list[dict[str, Any]],
    *,
    search: str | None = None,
    author: str | None = None,
    filters: list[str] | tuple[str, ...] = (),
    sort: str | None = None,
    direction: str | None = None,
    limit: str | None = None,
    full: bool = False,
    expand: list[str] | tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """The entries the Hub answers for this query, in its order and with its fields."""
    if sort is not None and sort not in SORTS:
        raise BadQuery(f"Invalid sort parameter: {sort}")
    try:
        count = min(MAX_LIMIT, int(limit)) if limit is not None else MAX_LIMIT
    except ValueError:
        raise BadQuery(f"Invalid limit parameter: {limit}") from None
    if count < 0:
        raise BadQuery(f"Invalid limit parameter: {limit}")
    found = [
        model
        for model in models
        if (not search or search.lower() in model["id"].lower())
        and (not author or model["id"].split("/")[0] == author)
        and all(tag in model["tags"] for tag in filters)
    ]
    key = sort or "trendingScore"
    ascending = key in ASCENDING_ALLOWED and direction not in (None, "-1")
    found.sort(key=lambda model: model.get(key, 0), reverse=not ascending)
    if full:
        fields = None
    elif expand:
        fields = ("_id", "id", *expand)
    else:
        fields = DEFAULT_FIELDS
    return [
        model if fields is None else {name: model[name] for name in fields if name in model}
        for model in found[:count]
    ]
