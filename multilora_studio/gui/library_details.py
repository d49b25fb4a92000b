"""The Library's details pane: one adapter's record and its newest history as HTML."""

from __future__ import annotations

import html

from multilora_studio.adapters.registry import QUANT_DRIFT
from multilora_studio.adapters.registry_lifecycle import AdapterEvent
from multilora_studio.adapters.registry_schema import AdapterRecord
from multilora_studio.gui.widgets import format_bytes, format_time
from multilora_studio.gui.workflows.library_selection import aliases_label

HISTORY_ROWS = 20  # the newest events of an adapter shown in its details
DRIFT_ROWS = 3  # the newest measures of its outputs on quantized bases shown apart


def details_html(record: AdapterRecord, tier: str, not_served: str | None, events: list[AdapterEvent]) -> str:
    """``record`` with where it is now (``tier``), why it is not served (None: it is) and ``events``."""
    rows = [
        ("Name", record.name),
        ("Aliases", aliases_label(record)),
        ("Tier now", tier),
        ("Source", record.source_label),
        ("Path", str(record.path)),
        ("Base", f"{record.base_name} (sha256 {record.base_digest[:12] or 'unknown'})"),
        ("Declared base", record.declared_base or "-"),
        ("Kind", record.contents_label),
        ("Rank / alpha", f"{record.rank} / {record.alpha:g}"),
        ("Targets", ", ".join(record.targets)),
        ("Size", format_bytes(record.size_bytes)),
        ("Pinned", "yes" if record.pinned else "no"),
        ("Created", format_time(record.created)),
        ("Last used", format_time(record.last_used) or "never"),
        ("Notes", record.notes or "-"),
    ]
    if not_served is not None:
        rows.insert(2, ("Not served", not_served))
    drifts = [e for e in events if e.event == QUANT_DRIFT][-DRIFT_ROWS:]
    for event in reversed(drifts):  # measured with ``multilora-studio drift``, newest first
        rows.append(("Quantized base", f"{event.reason} ({format_time(event.time)})"))
    rows.insert(1, ("State", record.state + (", warm at start" if record.warm else "")))
    if record.archive_path is not None:
        rows.insert(2, ("Archive", str(record.archive_path)))
    cells = "".join(f"<tr><td><b>{html.escape(k)}</b></td><td>{html.escape(v)}</td></tr>" for k, v in rows)
    history = "".join(
        f"<tr><td>{html.escape(format_time(e.time))}</td><td>{html.escape(e.event)}</td>"
        f"<td>{html.escape(e.reason)}</td></tr>"
        for e in events[-HISTORY_ROWS:]
    )
    return (
        f"<h3>{html.escape(record.name)}</h3><table cellspacing='4'>{cells}</table>"
        f"<h4>History</h4><table cellspacing='4'>{history}</table>"
    )


def empty_html(any_records: bool) -> str:
    """What the details say with no adapter selected (``any_records``: the library has some)."""
    if any_records:  # filtered out or not
        return "<p>Select an adapter to see its details.</p>"
    return (
        "<p>The library is empty.</p><p>Import a PEFT folder (adapter_config.json + "
        "adapter_model.safetensors) or pull an adapter from the Hugging Face Hub.</p>"
    )
