"""The routing study's policies and simulation on small cases with hand-checked answers."""

from __future__ import annotations

import pytest

from multilora_studio.bench.routing_policies import Router
from multilora_studio.bench.routing_sim import CostModel, Scenario, render, simulate, study
from multilora_studio.cli import main


def test_round_robin_takes_replicas_in_turn_whatever_they_hold():
    router = Router("round-robin", 3, slots=2, host=4)
    router.use(2, 7)
    assert [router.pick(7) for _ in range(5)] == [0, 1, 2, 0, 1]


def test_least_loaded_takes_the_first_of_the_fewest_requests():
    router = Router("least-loaded", 3, slots=2, host=4)
    router.load[:] = [3, 1, 1]
    assert router.pick(0) == 1


def test_affinity_prefers_the_slot_holder_then_the_host_holder_within_the_margin():
    router = Router("affinity", 3, slots=1, host=3, margin=4)
    router.use(2, 5)  # adapter 5 in replica 2's slot and host RAM
    router.done(2, 5)
    router.use(2, 6)  # 6 takes the only slot: 5 stays in host RAM only
    router.done(2, 6)
    router.use(1, 5)  # and in replica 1's slot
    router.done(1, 5)
    router.load[:] = [0, 4, 0]
    assert router.pick(5) == 1  # slot holder, 4 requests over the least: within the margin
    router.load[:] = [0, 5, 0]
    assert router.pick(5) == 0  # 5 over the least: the least-loaded instead
    router.load[:] = [0, 0, 0]
    assert router.pick(6) == 2  # only replica 2 has 6 (in its slot)
    assert router.pick(9) == 0  # nobody has 9: the least-loaded


def test_ray_multiplexed_prefers_holders_below_max_ongoing_then_fewest_models():
    router = Router("ray-multiplexed", 4, slots=1, host=3, max_ongoing=2)
    for replica, adapter in ((0, 1), (1, 1), (1, 2), (3, 3)):
        router.use(replica, adapter)
        router.done(replica, adapter)
    router.load[:] = [0, 1, 0, 0]
    assert router.pick(1) == 0  # holders 0 and 1: the shorter queue of the two
    router.load[:] = [2, 1, 0, 0]
    assert router.pick(1) == 1  # replica 0 is at max_ongoing
    router.load[:] = [2, 2, 0, 0]
    assert router.pick(1) == 2  # no holder has room: the fewest models (replica 2 has none)
    assert router.pick(4) == 2  # an adapter nobody has: the fewest models


def test_the_lru_tiers_never_evict_a_slot_in_use():
    router = Router("least-loaded", 1, slots=2, host=3)
    assert [router.use(0, a) for a in (1, 2)] == ["disk", "disk"]
    router.done(0, 2)
    assert router.use(0, 3) == "disk"  # evicts 2 (1 is in use), host keeps 1, 2, 3
    router.done(0, 3)
    assert router.use(0, 2) == "host"  # back from host RAM into a slot (evicting 3, not 1)
    assert list(router.caches[0].slots) == [1, 2]
    assert router.in_slots[3] == set() and router.in_host[3] == {0}


def test_the_cost_model_reads_the_measured_steps():
    costs = CostModel()
    assert costs.step_s(1, 0) == pytest.approx(4.90e-3)
    assert costs.step_s(32, 0) == pytest.approx(5.76e-3)
    assert costs.step_s(32, 32) == pytest.approx(6.41e-3)
    assert costs.step_s(1, 1) == pytest.approx(5.30e-3)
    assert costs.capacity(128, 128) == pytest.approx(32 / (128 * 0.026e-3 + 128 * 6.41e-3))


def test_one_replica_one_adapter_loads_once_and_hits_after():
    costs = CostModel()
    outcome = simulate(
        Scenario(adapters=1, replicas=1, load=1e-4, policy="affinity", requests_per_replica=3), costs
    )
    # requests far apart: the first loads from disk, the two others find it in the slot
    assert outcome.disk_loads_per_1000 == pytest.approx(1000 / 3)
    assert outcome.slot_hit_rate == pytest.approx(2 / 3)
    alone = 128 * costs.prefill_ms_per_token / 1e3 + costs.step_s(1, 1)
    assert outcome.ttft_p50_s == pytest.approx(alone)
    assert max(outcome.ttft_p99_s, 0) == pytest.approx(
        alone + (costs.disk_load_s + costs.upload_s) * 0.98, rel=0.05
    )


def test_affinity_loads_fewer_adapters_than_round_robin_on_many_replicas():
    outcomes = {o.scenario.policy: o for o in study([200], [16], [0.7], requests_per_replica=50)}
    assert outcomes["affinity"].slot_loads_per_1000 < 0.5 * outcomes["round-robin"].slot_loads_per_1000
    assert outcomes["affinity"].ttft_p50_s < outcomes["round-robin"].ttft_p50_s
    assert "affinity" in render(list(outcomes.values()))


def test_bench_routing_sim_prints_the_study(capsys):
    code = main(
        ["bench", "--routing-sim", "--sim-adapters", "100", "--sim-replicas", "4", "--sim-loads", "0.5",
         "--sim-requests-per-replica", "20"]
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert all(policy in out for policy in ("round-robin", "least-loaded", "affinity", "ray-multiplexed"))
