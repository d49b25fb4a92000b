"""Engines offer the serving roles they really have: a Ray deployment's ingress engine neither
pins adapters (its replicas keep them by Ray's multiplexed LRU) nor takes metrics snapshots, so
consumers that ask for those roles skip it instead of meeting a refusal."""

from __future__ import annotations

import pytest

from multilora_studio.deploy import ReplicaSet
from multilora_studio.engine import Engine, EngineConfig
from multilora_studio.engine.serving_engine import AdapterPinning, MetricsSource, metrics_of, pinned_of


def test_each_engine_offers_the_roles_it_has():
    remote_engine = pytest.importorskip("multilora_studio.ray_app.remote_engine")  # Ray: an extra
    remote = remote_engine.RemoteEngine
    for engine in (Engine, ReplicaSet):
        assert issubclass(engine, AdapterPinning) and issubclass(engine, MetricsSource), engine
    assert not issubclass(remote, AdapterPinning) and not issubclass(remote, MetricsSource)


def test_the_role_helpers_ask_a_running_engine(tiny_model_dir, tiny_adapters):
    config = EngineConfig(model=str(tiny_model_dir), device="cpu", dtype="float32", max_model_len=64)
    with Engine(config) as engine:
        engine.add_adapter("kept", tiny_adapters["tiny-r4-qv"])
        engine.pin_adapter("kept")
        assert pinned_of(engine) == ["kept"]
        snapshot = metrics_of(engine, fresh=True)
        assert snapshot is not None and len(snapshot.slots) == config.max_loras
    assert metrics_of(object()) is None and pinned_of(object()) == []
