"""Several replicas' metrics snapshots as one, for the views that show one number per base
(the status bar, the Library's tiers): counts are summed, slots listed replica after replica."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from multilora_studio.adapters.load_latency import LoadQuantiles
from multilora_studio.engine import EngineMetrics
from multilora_studio.engine.outputs import AdapterLoadTimes, SlotState


def combine_metrics(snaps: Sequence[EngineMetrics]) -> EngineMetrics:
    """One snapshot of ``snaps`` (at least one): the sum of every count and rate; ``state``
    running while any replica is; ``device`` the replicas' devices; slots numbered on across
    replicas; the host tier the adapters any replica holds; cold-load and upload quantiles the
    slowest replica's, overall and per adapter (whose loads are summed); the loader kind the
    first replica's."""
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
        adapter_loads=combine_adapter_loads(snaps),
    )
    return EngineMetrics(**values)  # type: ignore[arg-type]


def combine_adapter_loads(snaps: Sequence[EngineMetrics]) -> tuple[AdapterLoadTimes, ...]:
    """Per adapter over ``snaps``: its loads of each tier summed, the slowest quantiles, by name."""
    by_name: dict[str, list[AdapterLoadTimes]] = {}
    for snap in snaps:
        for loads in snap.adapter_loads:
            by_name.setdefault(loads.adapter, []).append(loads)
    return tuple(
        AdapterLoadTimes(
            name,
            slowest([p.disk_to_host for p in parts]),
            slowest([p.host_to_gpu for p in parts]),
        )
        for name, parts in sorted(by_name.items())
    )


def slowest(parts: Sequence[LoadQuantiles]) -> LoadQuantiles:
    """The loads of ``parts`` summed with the largest of their quantiles."""
    p50s = [p.p50_s for p in parts if p.p50_s is not None]
    p95s = [p.p95_s for p in parts if p.p95_s is not None]
    return LoadQuantiles(sum(p.loads for p in parts), max(p50s, default=None), max(p95s, default=None))
