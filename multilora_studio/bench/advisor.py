"""Cache sizes from recorded traffic: replay a server's request trace (``/v1/usage/trace``)
through a model of the engine's tiers and recommend ``max_loras``, ``max_cpu_loras``, the
adapters to pin and the merge candidates, each with its predicted effect.

The model is the engine's: GPU slots and the host tier are least-recently-used, a slot in use
is never evicted, pinned adapters hold their slots; requests are replayed in arrival order with
``concurrency`` of them running at once (the trace's mean requests in flight: the sum of their
latencies over its span), so a request's adapter keeps its slot while it runs. Predicted TTFT
per request: the trace's median TTFT of the requests that found their adapter where the replay
puts it (a slot, host RAM, disk), so the p95 moves with the predicted disk reads.
"""

from __future__ import annotations

import json
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from multilora_studio.bench.routing_policies import Router

SLOT_OPTIONS = (2, 4, 8, 16, 32, 64, 128)
HOST_MULTIPLES = (2, 4, 8, 16)
KNEE_POINTS = 1.0  # a larger setting must add this many points of slot hit rate to be worth it
PIN_SHARE = 0.05  # an adapter this share of the requests or more is a pin candidate
MERGE_SHARE = 0.5  # one adapter with this share or more: a merged deployment of its own


@dataclass(frozen=True)
class TraceRequest:
    time: float
    adapter: str | None  # None: the base model
    tier: str | None  # where the engine found its adapter: "gpu", "host", "loading", "disk"
    ttft_s: float | None
    latency_s: float


@dataclass(frozen=True)
class Prediction:
    max_loras: int
    max_cpu_loras: int
    pinned: tuple[str, ...]
    slot_hit_rate: float  # of adapter requests
    host_hit_rate: float  # of adapter requests that missed the slots
    disk_loads_per_1000: float  # per 1,000 adapter requests
    ttft_p95_s: float | None


@dataclass(frozen=True)
class Advice:
    requests: int
    adapters: int
    concurrency: int
    recorded: Prediction  # the settings the trace ran with, when given
    recommended: Prediction
    pin: tuple[str, ...]
    merge: tuple[str, ...]
    shares: dict[str, float]  # the most requested adapters' shares
    alternatives: tuple[Prediction, ...]


def read_trace(path: Path) -> list[TraceRequest]:
    """The answered requests of a trace file (JSON lines of ``/v1/usage/trace``)."""
    return parse_trace(path.read_text(encoding="utf-8"), str(path))


def parse_trace(text: str, where: str = "the trace") -> list[TraceRequest]:
    """The answered requests of ``/v1/usage/trace``'s JSON lines, in arrival order."""
    requests = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if row["status"] != 200:
                continue
            requests.append(
                TraceRequest(
                    float(row["time"]),
                    row["adapter"],
                    row["adapter_tier"],
                    row["ttft_s"],
                    float(row["latency_s"]),
                )
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{where}:{number}: not a request of /v1/usage/trace ({error})") from None
    if not requests:
        raise ValueError(f"{where} holds no answered request to replay")
    return sorted(requests, key=lambda r: r.time)


def concurrency_of(trace: Sequence[TraceRequest]) -> int:
    """Mean requests in flight: their summed latency over the trace's span (at least 1)."""
    span = max(r.time + r.latency_s for r in trace) - trace[0].time
    return max(1, round(sum(r.latency_s for r in trace) / span)) if span > 0 else 1


def replay(
    trace: Sequence[TraceRequest], slots: int, host: int, concurrency: int, pinned: Sequence[str] = ()
) -> tuple[Prediction, list[str]]:
    """The trace through the tier model: its prediction and each adapter request's tier."""
    ids = {name: i for i, name in enumerate(dict.fromkeys(r.adapter for r in trace if r.adapter))}
    router = Router("least-loaded", 1, slots, max(host, slots + 1))
    for name in pinned:  # pinned: loaded once, held for good
        router.use(0, ids[name])
    running: deque[int] = deque()
    tiers: list[str] = []
    for request in trace:
        if request.adapter is None:
            continue
        if len(running) >= concurrency:
            router.done(0, running.popleft())
        adapter = ids[request.adapter]
        tiers.append(router.use(0, adapter))
        running.append(adapter)
    counts = Counter(tiers)
    total = max(1, len(tiers))
    misses = counts["host"] + counts["disk"]
    prediction = Prediction(
        max_loras=slots,
        max_cpu_loras=host,
        pinned=tuple(pinned),
        slot_hit_rate=counts["gpu"] / total,
        host_hit_rate=counts["host"] / misses if misses else 1.0,
        disk_loads_per_1000=1000.0 * counts["disk"] / total,
        ttft_p95_s=_ttft_p95(trace, tiers),
    )
    return prediction, tiers


def _ttft_p95(trace: Sequence[TraceRequest], tiers: Sequence[str]) -> float | None:
    """p95 of each adapter request's TTFT predicted from the trace's medians by tier."""
    by_tier: dict[str, list[float]] = {}
    for request in trace:
        if request.adapter is not None and request.ttft_s is not None and request.tier is not None:
            tier = "disk" if request.tier == "loading" else request.tier
            by_tier.setdefault(tier, []).append(request.ttft_s)
    medians = {tier: float(np.median(values)) for tier, values in by_tier.items()}
    if not medians:
        return None
    fallback = medians.get("disk", max(medians.values()))
    predicted = [medians.get(tier, fallback if tier == "disk" else min(medians.values())) for tier in tiers]
    return float(np.quantile(predicted, 0.95)) if predicted else None


def advise(
    trace: Sequence[TraceRequest],
    max_loras_limit: int = 128,
    recorded: tuple[int, int] | None = None,
    concurrency: int | None = None,
) -> Advice:
    """Recommended settings for ``trace`` (see the module docstring), within ``max_loras_limit``
    slots (what the GPU's memory allows)."""
    adapter_requests = [r.adapter for r in trace if r.adapter is not None]
    if not adapter_requests:
        raise ValueError("the trace has no adapter requests: nothing to size")
    running = concurrency or concurrency_of(trace)
    shares = {name: count / len(adapter_requests) for name, count in Counter(adapter_requests).most_common()}
    options = [s for s in SLOT_OPTIONS if s <= max_loras_limit and s >= min(running, max_loras_limit)]
    options = options or [max_loras_limit]
    by_slots = {s: replay(trace, s, 2 * s, running)[0] for s in options}
    chosen = options[-1]
    for slots in options:  # the smallest within KNEE_POINTS of the largest
        if by_slots[options[-1]].slot_hit_rate - by_slots[slots].slot_hit_rate <= KNEE_POINTS / 100:
            chosen = slots
            break
    hosts = {m: replay(trace, chosen, m * chosen, running)[0] for m in HOST_MULTIPLES}
    best_loads = min(p.disk_loads_per_1000 for p in hosts.values())
    host_multiple = next(m for m in HOST_MULTIPLES if hosts[m].disk_loads_per_1000 <= best_loads * 1.05 + 0.5)
    pin = tuple(name for name, share in shares.items() if share >= PIN_SHARE)[: max(0, chosen // 4)]
    base_prediction = hosts[host_multiple]
    pinned_prediction = replay(trace, chosen, host_multiple * chosen, running, pin)[0] if pin else None
    if pinned_prediction is not None and pinned_prediction.slot_hit_rate < base_prediction.slot_hit_rate:
        pin, pinned_prediction = (), None  # pinning would cost the others more than it saves
    recommended = pinned_prediction or base_prediction
    merge = tuple(name for name, share in shares.items() if share >= MERGE_SHARE)
    recorded_slots, recorded_host = recorded or (chosen, host_multiple * chosen)
    return Advice(
        requests=len(trace),
        adapters=len(shares),
        concurrency=running,
        recorded=replay(trace, recorded_slots, recorded_host, running)[0],
        recommended=recommended,
        pin=pin,
        merge=merge,
        shares=dict(list(shares.items())[:10]),
        alternatives=tuple(by_slots.values()),
    )


def render(advice: Advice) -> str:
    """The advice as the terminal shows it."""

    def line(label: str, p: Prediction) -> str:
        ttft = f"{p.ttft_p95_s * 1000:.0f} ms" if p.ttft_p95_s is not None else "-"
        pins = f", pinned {', '.join(p.pinned)}" if p.pinned else ""
        return (
            f"{label:<12} max_loras {p.max_loras:>4}, max_cpu_loras {p.max_cpu_loras:>5}{pins}: slot hits "
            f"{p.slot_hit_rate:.1%}, host hits {p.host_hit_rate:.1%} of misses, "
            f"{p.disk_loads_per_1000:.0f} disk loads / 1,000, TTFT p95 {ttft}"
        )

    lines = [
        f"{advice.requests} requests, {advice.adapters} adapters, {advice.concurrency} in flight on average",
        line("recorded", advice.recorded),
        line("recommended", advice.recommended),
        "by max_loras (host tier 2x):",
        *(line("", p) for p in advice.alternatives),
        "most requested: " + ", ".join(f"{n} {s:.0%}" for n, s in advice.shares.items()),
    ]
    if advice.pin:
        lines.append(f"pin: {', '.join(advice.pin)} (multilora-studio adapters pin NAME)")
    for name in advice.merge:
        lines.append(
            f"merge candidate: {name} carries {advice.shares[name]:.0%} of the requests; a merged "
            f"deployment of its own has no adapter cost (multilora-studio merge {name} --out FOLDER)"
        )
    return "\n".join(lines)


def advice_json(advice: Advice) -> str:
    return json.dumps(asdict(advice), indent=2)
