"""Timing hooks into a running engine, for benchmarks and diagnosis (not for serving).

Whatever touches the device runs on the engine's worker thread between two steps
(``Engine.call_on_worker``), so it holds up every request while it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

import torch

from multilora_studio.engine.loop.worker import EngineWorker
from multilora_studio.engine.step.runner import ModelRunner

T = TypeVar("T")


class RunningEngine(Protocol):
    """What the hooks read of an ``Engine``: its device, its worker and runner (read-only), and
    the way onto its worker thread."""

    device: torch.device
    worker: EngineWorker
    runner: ModelRunner

    def call_on_worker(self, work: Callable[[], T]) -> T: ...


def step_profile(engine: RunningEngine) -> dict[str, float]:
    """Cumulative seconds the worker spent per phase of its steps, and the step count.

    ``launch`` is host time to enqueue the forward pass; on CUDA the device time shows up
    in ``sample``, which waits for the logits.
    """
    return dict(engine.worker.phase_seconds)


def time_decode_graph(engine: RunningEngine, batch: int, uses_lora: bool, iters: int = 50) -> float:
    """Median device milliseconds of one replay of the decode graph for ``batch`` (CUDA only)."""
    graphs = engine.runner.decode_graphs
    if graphs is None:
        raise ValueError("decode graphs are not in use (CPU device or enforce_eager)")
    graph = graphs.graph_for(batch, uses_lora)

    def replays() -> float:
        times = []
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return sorted(times)[len(times) // 2]

    return engine.call_on_worker(replays)


def time_slot_upload(engine: RunningEngine, name: str) -> dict[str, float]:
    """Re-upload a resident, idle adapter into its own slot and time it (CUDA only).

    Returns the upload's device milliseconds, those of one plain pinned host-to-device
    copy of the same number of bytes, and the bytes.
    """
    tiers = engine.worker.tiers

    def uploads() -> dict[str, float]:
        slot, packed = tiers.slots.slot_of(name), tiers.host_tier.cache.get(name)
        stream = tiers.upload_stream
        if stream is None or slot is None or packed is None or tiers.slots.in_use(name):
            raise ValueError(f"{name!r} must be resident in a GPU slot and host RAM, idle, on CUDA")

        def timed(work: Callable[[], object]) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(stream):
                start.record(stream)
                work()
                end.record(stream)
            end.synchronize()
            return start.elapsed_time(end)

        source = torch.empty(packed.nbytes, dtype=torch.uint8).pin_memory()
        target = torch.empty(packed.nbytes, dtype=torch.uint8, device=engine.device)
        timed(lambda: target.copy_(source, non_blocking=True))  # warm-up
        timed(lambda: tiers.lora.upload(slot, packed))
        return {
            "upload_ms": timed(lambda: tiers.lora.upload(slot, packed)),
            "pinned_copy_ms": timed(lambda: target.copy_(source, non_blocking=True)),
            "bytes": float(packed.nbytes),
        }

    return engine.call_on_worker(uploads)
