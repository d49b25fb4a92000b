"""The Library's choices as plain rules: what each action offers for the selected adapter, the
entries of the base filter, and how the person's answers to the actions' questions are read."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from multilora_studio.adapters.registry_schema import AdapterRecord
from multilora_studio.gui.base_states import BaseState


@dataclass(frozen=True)
class SelectedActions:
    """The selected adapter's buttons: whether they apply (no selection: none does) and what each says."""

    selected: bool
    pin: str
    retire: str
    retire_enabled: bool
    archive: str
    warm: str
    alias_warm_enabled: bool

    @classmethod
    def of(cls, record: AdapterRecord | None) -> SelectedActions:
        state = record.state if record is not None else "active"
        return cls(
            selected=record is not None,
            pin="Unpin" if record is not None and record.pinned else "Pin",
            retire="Reactivate" if state == "retired" else "Retire",
            retire_enabled=record is not None and state != "archived",
            archive="Restore" if state == "archived" else "Archive",
            warm="Not warm" if record is not None and record.warm else "Warm at start",
            alias_warm_enabled=record is not None and bool(record.aliases),
        )


def lifecycle_action(label: str) -> str:
    """The lifecycle action a button's label names: retire, reactivate, archive or restore."""
    return label.lower()


def warm_list(text: str) -> list[str]:
    """The adapters a comma-separated answer names."""
    return [name.strip() for name in text.split(",") if name.strip()]


def aliases_label(record: AdapterRecord) -> str:
    """Its aliases, each with the adapters its first use reads ("support (warms a, b)")."""
    lists = dict(record.alias_warm)
    parts = [a + (f" (warms {', '.join(lists[a])})" if lists.get(a) else "") for a in record.aliases]
    return ", ".join(parts) or "-"


def base_key(record: AdapterRecord) -> str:
    """What the Library's base filter groups by: the base weights' digest (the name when the
    digest is unknown)."""
    return record.base_digest or f"name:{record.base_name}"


@dataclass(frozen=True)
class BaseFilterEntry:
    """One entry of the base filter: its label, the key rows are filtered by, the base's name."""

    label: str
    key: str
    name: str


def base_filter_entries(
    records: Iterable[AdapterRecord], bases: Iterable[BaseState]
) -> list[BaseFilterEntry]:
    """Every base of the library's adapters and every base the window serves, by name and digest."""
    served = {base.digest: base.name for base in bases if base.digest}
    choices = {base_key(r): (r.base_name, r.base_digest) for r in records}
    for digest, name in served.items():
        choices.setdefault(digest, (name, digest))
    entries = []
    for key, (name, digest) in sorted(choices.items(), key=lambda item: item[1]):
        mark = f" (sha256 {digest[:12]})" if digest else " (digest unknown)"
        where = ", served" if digest in served else ""
        entries.append(BaseFilterEntry(f"{name}{mark}{where}", key, name))
    return entries
