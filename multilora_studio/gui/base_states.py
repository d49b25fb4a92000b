"""What the window shows of each base model of its pool: loaded, parked in host memory, swapped
out (stopped) or loading, with the loaded or parked engine's metrics snapshot (read once per timer
tick, no call into an engine's worker)."""

from __future__ import annotations

from dataclasses import dataclass

from multilora_studio.deploy import BasePool, replicas_of
from multilora_studio.engine import EngineConfig, EngineMetrics
from multilora_studio.engine.serving_engine import metrics_of

LOADED, PARKED, SWAPPED_OUT, LOADING = "loaded", "parked in host memory", "swapped out", "loading"


@dataclass(frozen=True)
class BaseState:
    """One base: its state, its snapshot while loaded or parked (one per replica when it has several),
    the adapters it serves, its load progress (fraction, message) while it loads, and the tokens
    per KV-cache block of its engine."""

    name: str
    digest: str
    state: str
    metrics: EngineMetrics | None
    replicas: tuple[tuple[str, EngineMetrics | None], ...]
    adapters: tuple[str, ...]
    progress: tuple[float, str] | None
    loads: int
    error: str | None
    block_size: int = EngineConfig.block_size


def base_states(pool: BasePool, progress: dict[str, tuple[float, str]]) -> list[BaseState]:
    """Every base of ``pool`` in its order; ``progress``: the loads in progress by base."""
    resident = dict(pool.resident())
    held = dict(pool.engines())  # the loaded engines and the parked ones
    states = []
    for name in pool.names:
        entry = pool.base(name)
        engine = held.get(name)
        metrics = metrics_of(engine)
        replicas = replicas_of(engine) if engine is not None else []
        snaps = (
            tuple((label, metrics_of(replica)) for label, replica in replicas)
            if len(replicas) > 1
            else (("0", metrics),)
        )
        if entry.loading:
            state = LOADING
        elif name in resident:
            state = LOADED
        else:
            state = PARKED if engine is not None else SWAPPED_OUT
        states.append(
            BaseState(
                name=name,
                digest=entry.digest,
                state=state,
                metrics=metrics,
                replicas=snaps,
                adapters=tuple(sorted(pool.adapters_of(name))),
                progress=progress.get(name) if state == LOADING else None,
                loads=entry.loads,
                error=entry.error,
                block_size=entry.config.block_size,
            )
        )
    return states
