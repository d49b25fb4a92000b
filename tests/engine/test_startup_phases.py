"""The engine says where its start-up time went, phase by phase."""

from __future__ import annotations

import time

from multilora_studio.engine import Engine
from tests.engine.conftest import tiny_engine_config


def test_start_up_phases_cover_the_start_and_add_up_within_it(tiny_model_dir, engine_device, caplog):
    caplog.set_level("INFO", logger="multilora_studio.engine.engine")
    started = time.perf_counter()
    with Engine(tiny_engine_config(tiny_model_dir, device=engine_device)) as engine:
        elapsed = time.perf_counter() - started
        phases = engine.runner.startup_seconds
    graphs = ["decode graphs", "mixed graphs"] if engine_device == "cuda" else []  # none on the CPU
    expected = [
        "device and model load",
        "slots and KV cache",
        *graphs,
        "kernel warm-up",
        "adapter tiers",
        "step loop",
    ]
    assert list(phases) == expected
    assert all(seconds >= 0 for seconds in phases.values())
    assert sum(phases.values()) <= elapsed  # parts of the start, measured inside it
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("engine ready:")]
    assert logged and all(phase in logged[0] for phase in phases)
