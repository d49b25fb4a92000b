"""Adapter-tier statistics of one case, from the engine's cumulative counters before and after it.

Rates are per request, from what had to move: the GPU hit rate is the share of adapter
requests that needed no slot upload (1 - uploads / adapter requests), the host hit rate the
share of uploads whose adapter was already in host RAM (1 - disk loads / uploads). The raw
engine counters are kept beside them.
"""

from __future__ import annotations

from typing import Any

import torch

from multilora_studio.engine import EngineMetrics


def _share_without(moves: int, total: int) -> float | None:
    return max(0.0, 1.0 - moves / total) if total else None


def tier_stats(
    before: EngineMetrics, after: EngineMetrics, adapter_requests: int, device: torch.device
) -> dict[str, Any]:
    uploads = after.gpu_misses - before.gpu_misses
    disk_loads = after.cpu_misses - before.cpu_misses
    return {
        "adapter_requests": adapter_requests,
        "slot_uploads": uploads,
        "cold_loads": disk_loads,
        "gpu_hit_rate": _share_without(uploads, adapter_requests),
        "cpu_hit_rate": _share_without(disk_loads, uploads),
        "engine_counters": {
            "gpu_hits": after.gpu_hits - before.gpu_hits,
            "gpu_misses": uploads,
            "cpu_hits": after.cpu_hits - before.cpu_hits,
            "cpu_misses": disk_loads,
        },
        "cold_load_p50_ms": None if after.cold_load_p50_s is None else after.cold_load_p50_s * 1e3,
        "cold_load_p95_ms": None if after.cold_load_p95_s is None else after.cold_load_p95_s * 1e3,
        "preemptions": after.preemptions - before.preemptions,
        "pinned_blocks_exhausted": after.pinned_blocks_exhausted - before.pinned_blocks_exhausted,
        # kernel compiles during the case: each one stalled every running request
        "kernel_compiles": after.kernel_compiles - before.kernel_compiles,
        "kernel_compile_s": after.kernel_compile_s - before.kernel_compile_s,
        "adapter_loader": f"{after.adapter_loader} x{after.adapter_load_workers}",
        "device_memory_bytes": after.device_memory_bytes,
        "peak_device_memory_bytes": torch.cuda.max_memory_allocated(device)
        if device.type == "cuda"
        else None,
    }
