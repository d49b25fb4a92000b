"""The window's start registers the library on a running engine: every active adapter, pinned
ones pinned, the others skipped with their reason, without writing the library (registering
is not a use: ``last_used`` stays as it was)."""

from __future__ import annotations

from multilora_studio.deploy import BasePool
from multilora_studio.engine import Engine, EngineConfig
from multilora_studio.gui.library_ops import load_library


def test_load_library_serves_the_active_adapters_and_writes_nothing(
    registry, tiny_base, tiny_adapters, tiny_model_dir
):
    registry.import_folder(tiny_adapters["tiny-r4-qv"], tiny_base, name="qv")
    registry.import_folder(tiny_adapters["tiny-r8-attn"], tiny_base, name="attn")
    registry.import_folder(tiny_adapters["tiny-r16-mlp"], tiny_base, name="mlp")
    registry.set_pinned("attn")
    registry.retire("mlp", "worse than attn")
    before = {record.name: record for record in registry.list_adapters()}
    config = EngineConfig(
        model=str(tiny_model_dir), device="cpu", dtype="float32", max_loras=2, max_lora_rank=16
    )
    with Engine(config) as engine, BasePool([config], started=[engine]) as pool:
        result = load_library(registry, pool)
        assert sorted(result.loaded) == ["attn", "qv"]
        assert list(result.skipped) == ["mlp"] and "retired" in result.skipped["mlp"]
        assert sorted(info.name for info in engine.list_adapters()) == ["attn", "qv"]
        assert engine.has_adapter("qv") and not engine.has_adapter("mlp")
        assert pool.base_of("attn") == (pool.primary, "attn") and pool.base_of("mlp") is None
        again = load_library(registry, pool)  # the adapters it serves already count as loaded
        assert sorted(again.loaded) == ["attn", "qv"]
    assert {record.name: record for record in registry.list_adapters()} == before
    assert all(record.last_used is None for record in before.values())
