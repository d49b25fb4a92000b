"""Pull an adapter (or a base model) from the Hub into the HF cache and register it in the library.

An adapter's config is fetched and checked first, so an adapter we cannot serve
is refused before its weights are downloaded. Then the weights, then the full
validation against the base model, then one transaction that registers it. Any
failure on the way (refusal, network, cancel) leaves no row, and the cache
transaction removes what the pull added to the HF cache.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from multilora_studio.adapters.adapter_config import CONFIG_FILE, parse_adapter_config, read_adapter_config
from multilora_studio.adapters.adapter_tokenizer import TOKENIZER_FOLDER_FILES
from multilora_studio.adapters.base_model import BaseModelRef
from multilora_studio.adapters.hub import (
    HubError,
    HubSettings,
    Progress,
    PullTooLarge,
    Snapshot,
    cache_transaction,
    fetch,
    parse_repo_ref,
    resolve,
)
from multilora_studio.adapters.peft_adapter import ADDED_TOKENS_FILE, PICKLE_SUFFIXES, WEIGHTS_FILE
from multilora_studio.adapters.registry import DEFAULT_MAX_RANK, Registry
from multilora_studio.adapters.registry_schema import AdapterRecord, BaseModelRecord
from multilora_studio.checkpoint_files import checkpoint_digest, checkpoint_files

MODEL_CONFIG = "config.json"
ADAPTER_EXTRAS = ("README.md", ADDED_TOKENS_FILE, *TOKENIZER_FOLDER_FILES)
MODEL_FILES = (
    MODEL_CONFIG,
    "generation_config.json",
    "model.safetensors.index.json",
    *TOKENIZER_FOLDER_FILES,
    "README.md",
)
BaseSource = BaseModelRef | Callable[[], BaseModelRef]


@dataclass(frozen=True)
class PullResult:
    """What a pull produced: an adapter record or a base model record."""

    repo_id: str
    revision: str
    path: Path
    adapter: AdapterRecord | None = None
    model: BaseModelRecord | None = None
    already_registered: bool = False


def pull(
    ref: str,
    registry: Registry,
    base: BaseSource,
    *,
    name: str | None = None,
    aliases: Sequence[str] = (),
    notes: str = "",
    max_rank: int = DEFAULT_MAX_RANK,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    settings: HubSettings | None = None,
    adapter_only: bool = False,
    max_bytes: int | None = None,
) -> PullResult:
    """Pull ``ORG/NAME[@REV]``; ``base`` (or a function returning it) is what adapters are checked against.

    ``adapter_only`` refuses a repository that is not a PEFT adapter (a base model, say);
    ``max_bytes`` (adapters only) refuses one whose files are larger, before downloading them.
    """
    settings = settings or HubSettings.from_env()
    repo_id, revision = parse_repo_ref(ref)
    registry.check_writable()  # a read-only library refuses before anything is downloaded
    snapshot = resolve(repo_id, revision, settings)
    if CONFIG_FILE in snapshot.files:
        return _pull_adapter(
            snapshot, registry, base, name, aliases, notes, max_rank, progress, cancel, settings, max_bytes
        )
    if adapter_only:
        raise HubError(
            f"{repo_id} is not a LoRA adapter: it has no {CONFIG_FILE} at {snapshot.revision[:12]}"
        )
    if MODEL_CONFIG in snapshot.files:
        return _pull_model(snapshot, registry, progress, cancel, settings)
    raise HubError(
        f"{repo_id} has neither {CONFIG_FILE} (a PEFT adapter) nor {MODEL_CONFIG} (a model) "
        f"at {snapshot.revision[:12]}"
    )


def _pull_adapter(
    snapshot: Snapshot,
    registry: Registry,
    base: BaseSource,
    name: str | None,
    aliases: Sequence[str],
    notes: str,
    max_rank: int,
    progress: Progress | None,
    cancel: threading.Event | None,
    settings: HubSettings,
    max_bytes: int | None = None,
) -> PullResult:
    existing = registry.find_hub(snapshot.repo_id, snapshot.revision)
    if existing is not None and name in (None, existing.name):
        return PullResult(
            snapshot.repo_id, snapshot.revision, existing.path, existing, already_registered=True
        )
    if WEIGHTS_FILE not in snapshot.files:
        pickles = sorted(f for f in snapshot.files if Path(f).suffix in PICKLE_SUFFIXES)
        detail = (
            f"only pickle weights ({', '.join(pickles)}), which can run code when loaded and are refused"
            if pickles
            else f"no {WEIGHTS_FILE}"
        )
        raise HubError(f"{snapshot.repo_id}@{snapshot.revision[:12]} has {detail}")
    registry.check_names(name or snapshot.repo_id, aliases)
    extras = [f for f in ADAPTER_EXTRAS if f in snapshot.files]
    files = [CONFIG_FILE, *extras, WEIGHTS_FILE]
    if max_bytes is not None:
        _check_size(snapshot, files, max_bytes)
    with cache_transaction(snapshot.repo_id, settings):
        folder = fetch(snapshot, [CONFIG_FILE], settings, _part(progress, 0.0, 0.05), cancel)
        parse_adapter_config(read_adapter_config(folder), snapshot.repo_id, max_rank)
        reference = base() if callable(base) else base
        folder = fetch(snapshot, files, settings, _part(progress, 0.05, 0.95), cancel)
        record = registry.register_hub(
            folder,
            reference,
            repo_id=snapshot.repo_id,
            revision=snapshot.revision,
            requested_revision=snapshot.requested,
            name=name,
            aliases=aliases,
            notes=notes,
            max_rank=max_rank,
        )
    if progress is not None:
        progress(1.0, f"registered {snapshot.repo_id} as {record.name!r}")
    return PullResult(snapshot.repo_id, snapshot.revision, folder, record)


def _check_size(snapshot: Snapshot, files: Sequence[str], max_bytes: int) -> None:
    """PullTooLarge unless the Hub gave every file's size and they add up to ``max_bytes`` at most."""
    where = f"{snapshot.repo_id}@{snapshot.revision[:12]}"
    unknown = [f for f in files if snapshot.files.get(f) is None]
    if unknown:
        raise PullTooLarge(f"{where}: the Hub did not give the size of {', '.join(unknown)}")
    size = sum(snapshot.files[f] or 0 for f in files)
    if size > max_bytes:
        raise PullTooLarge(f"{where} is {size} bytes; this pull takes at most {max_bytes}")


def _pull_model(
    snapshot: Snapshot,
    registry: Registry,
    progress: Progress | None,
    cancel: threading.Event | None,
    settings: HubSettings,
) -> PullResult:
    weights = sorted(f for f in snapshot.files if "/" not in f and f.endswith(".safetensors"))
    if not weights:
        pickles = sorted(f for f in snapshot.files if Path(f).suffix in PICKLE_SUFFIXES)
        raise HubError(
            f"{snapshot.repo_id} has no safetensors weights"
            + (f" (only {', '.join(pickles)}: pickle files can run code and are refused)" if pickles else "")
        )
    files = [f for f in MODEL_FILES if f in snapshot.files] + weights
    with cache_transaction(snapshot.repo_id, settings):
        folder = fetch(snapshot, files, settings, _part(progress, 0.0, 0.9), cancel)
        config = _model_config(folder / MODEL_CONFIG, snapshot.repo_id)
        if progress is not None:
            progress(0.95, "computing the weights digest")
        digest = checkpoint_digest(checkpoint_files(folder))  # the engine's Engine.base_digest
        record = registry.register_base_model(
            snapshot.repo_id, snapshot.revision, snapshot.requested, folder, digest
        )
    if progress is not None:
        progress(1.0, f"pulled base model {snapshot.repo_id} ({config.get('model_type')})")
    return PullResult(snapshot.repo_id, snapshot.revision, folder, model=record)


def _part(progress: Progress | None, start: float, end: float) -> Progress | None:
    if progress is None:
        return None
    return lambda fraction, message: progress(start + (end - start) * fraction, message)


def _model_config(path: Path, repo_id: str) -> dict:
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise HubError(f"{repo_id}: {MODEL_CONFIG} is not valid JSON: {error}") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise HubError(f"{repo_id}: {MODEL_CONFIG} has no model_type; is it a transformers model?")
    return config
