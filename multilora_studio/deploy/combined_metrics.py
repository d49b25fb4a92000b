"""Several replicas' metrics snapshots as one, for the views that show one number per base
(the status bar, the Library's tiers): counts are summed, slots listed replica after replica."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from multilora_studio.engine import EngineMetrics
from multilora_studio.engine.outputs import SlotState


def combine_metrics(snaps: Sequence[EngineMetrics]) -> EngineMetrics:
    """One snapshot of ``snaps`` (at least one): the sum of every count and rate; ``state``
    running while any replica is; ``device`` the replicas' devices; slots numbered on across
    replicas; the host tier the adapters any replica holds; cold-load and upload quantiles the
    slowest replica's; the loader kind the first replica's."""
    first = snaps[0]
    values: dict[str, object] = {}
    for field in dataclasses.fields(EngineMetrics):
        parts = [getattr(snap, field.name) for snap in snaps]
        if all(isinstance(part, (int, float)) and not isinstance(part, bool) for part in parts):
            values[field.name] = sum(parts)  # the optional ones (cold-load quantiles) come below
    slots: list[SlotState] = []
    for snap in snaps:
        first_slot = len(slots)
        slots.extend(dataclasses.replace(slot, slot=first_slot + i) for i, slot in enumerate(snap.slots))
    colds_50 = [s.cold_load_p50_s for s in snaps if s.cold_load_p50_s is not None]
    colds_95 = [s.cold_load_p95_s for s in snaps if s.cold_load_p95_s is not None]
    uploads_50 = [s.upload_p50_s for s in snaps if s.upload_p50_s is not None]
    uploads_95 = [s.upload_p95_s for s in snaps if s.upload_p95_s is not None]
    values.update(
        state="running" if any(s.state == "running" for s in snaps) else first.state,
        device=",".join(s.device for s in snaps),
        slots=tuple(slots),
        cpu_adapters=tuple(dict.fromkeys(a for s in snaps for a in s.cpu_adapters)),
        cold_load_p50_s=max(colds_50) if colds_50 else None,
        cold_load_p95_s=max(colds_95) if colds_95 else None,
        upload_p50_s=max(uploads_50) if uploads_50 else None,
        upload_p95_s=max(uploads_95) if uploads_95 else None,
        adapter_loader=first.adapter_loader,
    )
    return EngineMetrics(**values)  # type: ignore[arg-type]
