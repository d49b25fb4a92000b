"""How many adapters the host tier holds: ``max_cpu_loras`` as set, or sized from host memory.

With ``max_cpu_loras=None`` the tier holds as many adapters of ``max_lora_rank`` on every
projection as fit in ``cpu_lora_memory_fraction`` of the host memory available when the engine
starts: at least twice the GPU slots (a slot's adapter and the next one), at most
``MAX_AUTO_HOST_ADAPTERS``. Memory is taken only as adapters arrive (the pinned arena grows in
chunks, engine/residency/pinned_arena.py), so a large tier costs nothing until it fills.
"""

from __future__ import annotations

import psutil

from multilora_studio.engine.config import EngineConfig

MAX_AUTO_HOST_ADAPTERS = 4096


def available_host_memory() -> int:
    """Bytes of host memory available now (free and reclaimable, as the OS reports it)."""
    return int(psutil.virtual_memory().available)


def least_host_capacity(config: EngineConfig) -> int:
    """The host tier's size before memory is known: as set, else the automatic size's floor."""
    return config.max_cpu_loras if config.max_cpu_loras is not None else 2 * config.max_loras


def host_tier_capacity(config: EngineConfig, adapter_bytes: int, available_bytes: int) -> int:
    """Adapters in the host tier for ``config`` when one adapter takes ``adapter_bytes``."""
    if config.max_cpu_loras is not None:
        return config.max_cpu_loras
    fitting = int(available_bytes * config.cpu_lora_memory_fraction) // max(1, adapter_bytes)
    return max(least_host_capacity(config), min(MAX_AUTO_HOST_ADAPTERS, fitting))
