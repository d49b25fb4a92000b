"""The engine's metrics snapshot, rebuilt by the worker at a bounded rate.

The worker records each step's tokens and batch here; ``publish`` turns them and the
scheduler's, KV cache's and adapter tiers' state into a new ``EngineMetrics`` at most every
``METRICS_INTERVAL_S`` (unless forced). Other threads read ``latest``: plain data, replaced
whole, never changed in place.
"""

from __future__ import annotations

import time

import torch

from multilora_studio.engine.batch.block_manager import BlockManager
from multilora_studio.engine.batch.scheduler import Scheduler, StepPlan
from multilora_studio.engine.outputs import AdapterLoadTimes, EngineMetrics, SlotState
from multilora_studio.engine.residency.tier_manager import WorkerTierManager
from multilora_studio.kernels.jit_watch import compile_count

METRICS_INTERVAL_S = 0.1
RATE_WINDOW_S = 2.0  # tokens/s is measured over the steps of this last stretch


class MetricsPublisher:
    """Counters of the worker's steps and the latest snapshot of them (worker thread)."""

    def __init__(
        self,
        device: torch.device,
        scheduler: Scheduler,
        blocks: BlockManager,
        tiers: WorkerTierManager,
    ) -> None:
        self.device = device
        self.scheduler = scheduler
        self.blocks = blocks
        self.tiers = tiers
        self.latest: EngineMetrics | None = None
        self.parked = False  # the base is swapped out (state "parked")
        self.preemptions = 0
        self.busy_seconds = 0.0
        self._generated = 0
        self._rate_window: list[tuple[float, int]] = []  # (time, tokens) of recent steps
        self._last_batch = (0, 0, 0)  # tokens, sequences, distinct adapters
        self._last_time = 0.0
        self._compiles_at_start = compile_count()  # after the warm-up and the graph captures
        self._loads: dict[str, AdapterLoadTimes] = {}  # by adapter, in the order of first loads
        self._loads_shown: tuple[AdapterLoadTimes, ...] = ()  # the same, as the last snapshot has it

    def record_step(self, plan: StepPlan, sampled: int, now: float) -> None:
        """A step of ``plan`` ran and sampled ``sampled`` tokens at ``now`` (monotonic)."""
        self._generated += sampled
        self._rate_window.append((now, sampled))
        adapters = {c.seq.adapter for c in plan.chunks}
        self._last_batch = (plan.num_tokens, len(plan.chunks), len(adapters - {None}))

    def publish(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_time < METRICS_INTERVAL_S:
            return
        self._last_time = now
        self._rate_window = [(t, n) for t, n in self._rate_window if now - t <= RATE_WINDOW_S]
        span = now - self._rate_window[0][0] if len(self._rate_window) > 1 else 0.0
        rate = sum(n for _, n in self._rate_window[1:]) / span if span > 0 else 0.0
        if not self.scheduler.has_work:
            rate = 0.0  # idle: nothing is being generated now
        tiers, host = self.tiers, self.tiers.host_tier
        counters = host.cache.counters
        memory = torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else 0
        tokens, size, distinct = self._last_batch
        compiled = compile_count()
        pool = tiers.lora.token_tables
        self.latest = EngineMetrics(
            state="parked" if self.parked else "running" if self.scheduler.has_work else "idle",
            device=str(self.device),
            steps=self.scheduler.step_count,
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            batch_tokens=tokens,
            batch_size=size,
            distinct_adapters=distinct,
            tokens_per_second=rate,
            total_generated_tokens=self._generated,
            kv_blocks_total=self.blocks.num_blocks,
            kv_blocks_free=self.blocks.num_free,
            preemptions=self.preemptions,
            slots=tuple(SlotState(s.slot, s.adapter, s.pinned, s.in_use) for s in tiers.slots.snapshot()),
            cpu_adapters=tuple(host.cache.names()),
            cpu_capacity=host.capacity,
            cpu_bytes=host.cache.nbytes,
            gpu_hits=tiers.gpu_hits,
            gpu_misses=tiers.gpu_misses,
            cpu_hits=counters.hits,
            cpu_misses=counters.misses,
            cold_load_p50_s=counters.percentile(0.5),
            cold_load_p95_s=counters.percentile(0.95),
            device_memory_bytes=memory,
            adapter_loader=host.loader,
            adapter_load_workers=host.load_workers,
            pinned_blocks_exhausted=0 if host.arena is None else host.arena.exhausted,
            kernel_compiles=compiled.compiles - self._compiles_at_start.compiles,
            kernel_compile_s=compiled.seconds - self._compiles_at_start.seconds,
            token_tables=len(pool.tables),
            token_tables_max=pool.max_tables,
            token_table_bytes=pool.used_bytes,
            token_table_budget_bytes=pool.max_bytes,
            busy_seconds=self.busy_seconds,
            upload_p50_s=tiers.upload_counters.percentile(0.5),
            upload_p95_s=tiers.upload_counters.percentile(0.95),
            adapter_loads=self._adapter_loads(),
            **self._prefix_cache(),
        )

    def _prefix_cache(self) -> dict[str, int]:
        """The prefix cache's counters and size, as ``EngineMetrics`` fields (none when it is off)."""
        cache = self.blocks.cache
        if cache is None:
            return {}
        return {
            "prefix_cache_queried_tokens": cache.counters.queried_tokens,
            "prefix_cache_hit_tokens": cache.counters.hit_tokens,
            "prefix_cache_blocks": cache.num_blocks,
        }

    def _adapter_loads(self) -> tuple[AdapterLoadTimes, ...]:
        """Each adapter's disk and upload figures: only the adapters loaded or removed since the
        last snapshot are redone (a library of thousands costs a copy of the tuple, not a sort)."""
        disk, upload = self.tiers.host_tier.cache.counters.adapters, self.tiers.upload_counters.adapters
        changed = disk.take_changed() | upload.take_changed()
        for name in changed:
            reads, uploads = disk.summary(name), upload.summary(name)
            if reads.loads or uploads.loads:
                self._loads[name] = AdapterLoadTimes(name, reads, uploads)
            else:
                self._loads.pop(name, None)  # removed
        if changed:
            self._loads_shown = tuple(self._loads.values())
        return self._loads_shown
