"""Library operations that touch both the registry and the running engine (run inside Tasks)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from multilora_studio.adapters.base_model import BaseModelRef
from multilora_studio.adapters.registry import LibraryError, Registry, check_record_base, serve_record
from multilora_studio.adapters.registry_lifecycle import not_served_because
from multilora_studio.adapters.registry_schema import AdapterRecord
from multilora_studio.deploy import BasePool
from multilora_studio.engine import ServingEngine
from multilora_studio.engine.serving_engine import AdapterPinning

log = logging.getLogger(__name__)

Report = Callable[[float, str], None]
REPORT_EVERY = 100  # adapters registered between progress reports (and chances to cancel)


@dataclass(frozen=True)
class LoadResult:
    """Which library adapters the engine serves now, and why the others are not served."""

    loaded: tuple[str, ...]
    skipped: dict[str, str]


def base_for(record: AdapterRecord, digests: dict[str, str]) -> str | None:
    """The base (of ``digests``: name -> weights digest, the first base first) that serves
    ``record``: the first whose weights it was validated against, else the first base unless
    its weights are known to differ; None when no base may serve it."""
    for name, digest in digests.items():
        if record.base_status(digest) == "ok":
            return name
    first = next(iter(digests))
    return first if record.base_status(digests[first]) != "mismatch" else None


def load_library(registry: Registry, pool: BasePool, report: Report | None = None) -> LoadResult:
    """Register every library adapter with the base it was validated against (``base_for``),
    and its aliases (``ModelAliases.add_record``); weights are read on first use. A loaded
    base's engine takes it at once (and its pin); a swapped-out base when it next loads. The
    library is read once and not written (registering is not a use: ``last_used`` stays)."""
    records = registry.list_adapters()
    digests = {name: pool.base(name).digest for name in pool.names}
    resident = dict(pool.resident())
    loaded: list[str] = []
    skipped: dict[str, str] = {}
    for index, record in enumerate(records):
        if report is not None and index % REPORT_EVERY == 0:
            report(index / max(1, len(records)), f"registering adapter {record.name}")
        if pool.base_of(record.name) is not None:
            loaded.append(record.name)
            pool.aliases.add_record(record)
            continue
        base = base_for(record, digests)
        try:
            if base is None:
                raise LibraryError(
                    f"validated against base {record.base_name} (sha256 {record.base_digest[:12]}), "
                    "which is not among the base models in Settings"
                )
            engine = resident.get(base)
            if engine is not None:
                serve_record(engine, record, preload=False)
            else:
                check_record_base(record, digests[base])
                refused = not_served_because(record, None, None)
                if refused is not None:
                    raise LibraryError(f"{record.name!r} is not served: {refused}")
                pool.register_adapter(base, record.name, record.path, pinned=record.pinned)
        except (ValueError, OSError) as error:
            skipped[record.name] = str(error)
            log.info("not serving %s: %s", record.name, error)
        else:
            loaded.append(record.name)
            pool.aliases.add_record(record)
    return LoadResult(tuple(loaded), skipped)


def add_to_engine(registry: Registry, engine: ServingEngine, record: AdapterRecord) -> None:
    """Serve ``record`` (refused if it was validated against other base weights); pin it if pinned."""
    registry.load_into(engine, record.name, preload=False)


def import_adapter(
    registry: Registry, engine: ServingEngine, folder: Path, name: str | None
) -> AdapterRecord:
    """Validate ``folder`` against the engine's base, copy it into the library and serve it."""
    record = registry.import_folder(
        folder, BaseModelRef.of_engine(engine), name=name or None, max_rank=engine.config.max_lora_rank
    )
    try:
        add_to_engine(registry, engine, record)
    except ValueError:
        registry.remove(record.name)
        raise
    return record


def remove_adapter(registry: Registry, engine: ServingEngine | None, name: str) -> AdapterRecord:
    """Stop serving ``name`` (refused while requests use it) and remove it from the library."""
    record = registry.get(name)
    if engine is not None and engine.has_adapter(record.name):
        engine.remove_adapter(record.name)
    return registry.remove(record.name)


def set_pinned(registry: Registry, engine: ServingEngine | None, name: str, pinned: bool) -> AdapterRecord:
    """Pin or unpin in the engine first (it may refuse: every slot pinned), then in the library."""
    record = registry.get(name)
    if isinstance(engine, AdapterPinning) and engine.has_adapter(record.name):
        engine.pin_adapter(record.name, pinned)
    return registry.set_pinned(record.name, pinned)


def rename_adapter(
    registry: Registry, engine: ServingEngine | None, name: str, new_name: str
) -> AdapterRecord:
    """Rename in the library, and serve it under the new name (refused while requests use it)."""
    new_name = new_name.strip()
    if not new_name:
        raise LibraryError("type a new name")
    record = registry.get(name)
    served = engine is not None and engine.has_adapter(record.name)
    if engine is not None and served:
        engine.remove_adapter(record.name)
    current = record
    try:
        current = registry.rename(record.name, new_name)
    finally:
        if engine is not None and served:
            add_to_engine(registry, engine, current)  # under the new name, or the old one if refused
    return current


def change_state(
    registry: Registry, engine: ServingEngine | None, name: str, action: str, reason: str = ""
) -> AdapterRecord:
    """Retire, reactivate, archive or restore ``name`` (``action``), the engine following: a
    retired or archived adapter stops being served (refused while requests use it), a
    reactivated one is served again."""
    record = registry.get(name)
    served = engine is not None and engine.has_adapter(record.name)
    if engine is not None and served and action in ("retire", "archive"):
        engine.remove_adapter(record.name)
    transitions = {
        "retire": registry.retire,
        "reactivate": registry.reactivate,
        "archive": registry.archive,
        "restore": registry.restore,
    }
    try:
        changed = transitions[action](record.name, reason)
    except BaseException:
        if engine is not None and served and action in ("retire", "archive"):
            add_to_engine(registry, engine, record)  # refused: it stays served
        raise
    if engine is not None and changed.state == "active" and not served:
        add_to_engine(registry, engine, changed)
    return changed


def set_warm(registry: Registry, engine: ServingEngine | None, name: str, warm: bool) -> AdapterRecord:
    """Mark ``name`` warm (read into host RAM at every engine start; now too, if served) or not."""
    record = registry.set_warm(name, warm)
    if engine is not None and warm and engine.has_adapter(record.name):
        engine.prefetch_adapters([record.name])
    return record


def add_alias(registry: Registry, pool: BasePool | None, name: str, alias: str) -> AdapterRecord:
    """Give ``name`` another name, served at once (requests may use it as their ``model``)."""
    alias = alias.strip()
    if not alias:
        raise LibraryError("type an alias")
    record = registry.add_alias(name, alias)
    if pool is not None:
        pool.aliases.add_record(record)
    return record


def set_alias_warm(registry: Registry, pool: BasePool | None, alias: str, names: list[str]) -> AdapterRecord:
    """Read ``names`` into host RAM on the first request by ``alias`` (``Registry.set_alias_warm``),
    from now on in the running pool too."""
    record = registry.set_alias_warm(alias, names)
    if pool is not None:
        pool.aliases.add_record(record)
    return record
