"""The routing study: many engine replicas of one base, simulated with this engine's measured
costs, under each routing policy (``routing_policies``).

The model (request level, event driven): Poisson arrivals at a fraction of the replicas'
capacity; each request asks for one adapter (Zipf popularity), a 128-token prompt and 128 new
tokens. A replica runs up to ``max_batch`` requests at once (continuous batching) and queues
the rest; a request that starts loads its adapter if its GPU slots lack it (from host RAM: a
slot upload; from disk: a cold load, then the upload), which delays that request only (loads
run beside the batch, as the engine's do). Its time on the replica is then the prefill and
128 decode steps at the step time of the batch it joins (batch size and distinct adapters at
its start: the approximation this model makes). TTFT = queueing + load + prefill + one step.

Costs (``CostModel``) are this engine's on one H200 with a Llama-3-8B-shaped base in bf16
(docs/BENCHMARKS.md, 2026-12-01 to 12-04): decode steps of 4.90 ms at batch 1 to 5.76 ms at
batch 32 without adapters, plus the LoRA term (0.40 ms with one adapter to 0.65 ms with 32
distinct); prefill 0.026 ms a token; a cold load 0.118 s; a slot upload of a rank-16 adapter
on all projections 1.8 ms.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from multilora_studio.bench.routing_policies import POLICIES, Router
from multilora_studio.deploy.dispatch_rule import DEFAULT_MARGIN


@dataclass(frozen=True)
class CostModel:
    """One replica's costs (seconds unless named ms); defaults: see the module docstring."""

    step_ms_batch_1: float = 4.90
    step_ms_batch_32: float = 5.76
    lora_ms_one: float = 0.40
    lora_ms_32_distinct: float = 0.65
    prefill_ms_per_token: float = 0.026
    disk_load_s: float = 0.118
    upload_s: float = 0.0018
    max_batch: int = 32

    def step_s(self, batch: int, distinct: int) -> float:
        """One decode step with ``batch`` rows of which ``distinct`` different adapters."""
        grow = (max(batch, 1) - 1) / 31
        base = self.step_ms_batch_1 + (self.step_ms_batch_32 - self.step_ms_batch_1) * grow
        lora = 0.0
        if distinct > 0:
            lora = self.lora_ms_one + (self.lora_ms_32_distinct - self.lora_ms_one) * (distinct - 1) / 31
        return (base + lora) / 1e3

    def request_s(self, prompt: int, output: int, batch: int, distinct: int) -> float:
        """A request's time on a replica once its adapter is in a slot: prefill and decode."""
        return prompt * self.prefill_ms_per_token / 1e3 + output * self.step_s(batch, distinct)

    def capacity(self, prompt: int, output: int) -> float:
        """Requests/s one replica finishes at a full batch of distinct adapters, nothing to load."""
        batch = self.max_batch
        return batch / self.request_s(prompt, output, batch, batch)


@dataclass(frozen=True)
class Scenario:
    """One point of the study."""

    adapters: int
    replicas: int
    load: float  # arrival rate over the replicas' capacity
    policy: str
    requests_per_replica: int = 100
    zipf: float = 1.0
    prompt: int = 128
    output: int = 128
    slots: int = 32
    host: int = 128  # adapters in each replica's host RAM
    margin: int = DEFAULT_MARGIN  # the affinity policy's allowance over the least-loaded replica
    seed: int = 0


@dataclass
class Outcome:
    """What a scenario measured."""

    scenario: Scenario
    requests: int
    slot_loads_per_1000: float  # adapters put in a GPU slot (from host RAM or disk)
    disk_loads_per_1000: float  # cold loads from disk
    slot_hit_rate: float
    ttft_p50_s: float
    ttft_p95_s: float
    ttft_p99_s: float
    throughput_tok_s: float
    per_replica_loads: list[int] = field(default_factory=list, repr=False)


def zipf_sampler(adapters: int, exponent: float, rng: np.random.Generator) -> Callable[[int], np.ndarray]:
    """Draws of adapter ids 0..adapters-1 with P(k) ~ 1 / (k + 1)^exponent."""
    weights = 1.0 / np.arange(1, adapters + 1) ** exponent
    cdf = np.cumsum(weights / weights.sum())
    return lambda count: np.minimum(np.searchsorted(cdf, rng.random(count)), adapters - 1)


def simulate(scenario: Scenario, costs: CostModel | None = None) -> Outcome:
    """Run one scenario (deterministic for its seed)."""
    costs = costs or CostModel()
    if scenario.slots < costs.max_batch:
        raise ValueError(f"slots ({scenario.slots}) must be at least the batch ({costs.max_batch})")
    rng = np.random.default_rng(scenario.seed)
    total = scenario.replicas * scenario.requests_per_replica
    rate = scenario.load * scenario.replicas * costs.capacity(scenario.prompt, scenario.output)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, total))
    wanted = zipf_sampler(scenario.adapters, scenario.zipf, rng)(total)
    router = Router(
        scenario.policy, scenario.replicas, scenario.slots, scenario.host, scenario.margin, scenario.seed
    )
    replicas = [_Replica() for _ in range(scenario.replicas)]
    events: list[tuple[float, int, int, int]] = []  # (time, order, kind, request)
    order = itertools.count()
    ttft = np.zeros(total)
    tiers: list[str] = [""] * total
    chosen = np.zeros(total, dtype=np.int64)
    finished_at = 0.0
    ARRIVE, FINISH = 0, 1
    for request in range(total):
        heapq.heappush(events, (float(arrivals[request]), next(order), ARRIVE, request))

    def start(replica: int, request: int, now: float) -> None:
        state = replicas[replica]
        adapter = int(wanted[request])
        tier = router.use(replica, adapter)
        tiers[request] = tier
        load_s = {"gpu": 0.0, "host": costs.upload_s, "disk": costs.disk_load_s + costs.upload_s}[tier]
        state.running[adapter] = state.running.get(adapter, 0) + 1
        batch, distinct = sum(state.running.values()), len(state.running)
        prefill_s = scenario.prompt * costs.prefill_ms_per_token / 1e3
        ttft[request] = now - arrivals[request] + load_s + prefill_s + costs.step_s(batch, distinct)
        done = now + load_s + costs.request_s(scenario.prompt, scenario.output, batch, distinct)
        heapq.heappush(events, (done, next(order), FINISH, request))

    while events:
        now, _, kind, request = heapq.heappop(events)
        if kind == ARRIVE:
            replica = router.pick(int(wanted[request]))
            chosen[request] = replica
            router.load[replica] += 1
            state = replicas[replica]
            if sum(state.running.values()) < costs.max_batch:
                start(replica, request, now)
            else:
                state.queue.append(request)
            continue
        replica, adapter = int(chosen[request]), int(wanted[request])
        state = replicas[replica]
        state.running[adapter] -= 1
        if not state.running[adapter]:
            del state.running[adapter]
        router.done(replica, adapter)
        router.load[replica] -= 1
        finished_at = max(finished_at, now)
        if state.queue:
            start(replica, state.queue.popleft(), now)
    slot_loads = sum(t != "gpu" for t in tiers)
    disk_loads = sum(t == "disk" for t in tiers)
    loads_by_replica = np.bincount(chosen[[t != "gpu" for t in tiers]], minlength=scenario.replicas)
    return Outcome(
        scenario=scenario,
        requests=total,
        slot_loads_per_1000=1000 * slot_loads / total,
        disk_loads_per_1000=1000 * disk_loads / total,
        slot_hit_rate=1 - slot_loads / total,
        ttft_p50_s=float(np.percentile(ttft, 50)),
        ttft_p95_s=float(np.percentile(ttft, 95)),
        ttft_p99_s=float(np.percentile(ttft, 99)),
        throughput_tok_s=total * scenario.output / (finished_at - float(arrivals[0])),
        per_replica_loads=loads_by_replica.tolist(),
    )


@dataclass
class _Replica:
    running: dict[int, int] = field(default_factory=dict)  # adapter -> requests running with it
    queue: deque[int] = field(default_factory=deque)


def study(
    adapters: Sequence[int],
    replicas: Sequence[int],
    loads: Sequence[float],
    policies: Sequence[str] = POLICIES,
    requests_per_replica: int = 100,
    margin: int = DEFAULT_MARGIN,
    seed: int = 0,
) -> Iterator[Outcome]:
    """Every combination, the same arrivals and adapters for every policy of one point."""
    for count, size, load in itertools.product(adapters, replicas, loads):
        for policy in policies:
            yield simulate(
                Scenario(count, size, load, policy, requests_per_replica, margin=margin, seed=seed)
            )


def render(outcomes: Sequence[Outcome]) -> str:
    """The study as a text table."""
    header = (
        f"{'adapters':>8} {'replicas':>8} {'load':>5} {'policy':<16} {'slot loads/1k':>13} "
        f"{'disk loads/1k':>13} {'slot hits':>9} {'TTFT p50':>9} {'p95':>8} {'p99':>8} {'tok/s':>10}"
    )
    lines = [header, "-" * len(header)]
    for o in outcomes:
        s = o.scenario
        lines.append(
            f"{s.adapters:>8} {s.replicas:>8} {s.load:>5.2f} {s.policy:<16} {o.slot_loads_per_1000:>13.1f} "
            f"{o.disk_loads_per_1000:>13.1f} {o.slot_hit_rate:>9.3f} {o.ttft_p50_s * 1e3:>7.0f}ms "
            f"{o.ttft_p95_s * 1e3:>6.0f}ms {o.ttft_p99_s * 1e3:>6.0f}ms {o.throughput_tok_s:>10.0f}"
        )
    return "\n".join(lines)
