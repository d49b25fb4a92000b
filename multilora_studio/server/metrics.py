"""Prometheus metrics: per-adapter request series from the server, each loaded base's engine state
from its snapshots (labelled ``base`` and ``replica``: one series per base model served and per
engine replica of it, ``0`` for a base on one device; bounded sets).

The per-adapter cold-start series (``multilora_adapter_load_seconds``, ``multilora_adapter_loads``)
are of at most ``LOAD_SERIES_ADAPTERS`` adapters per base and replica, those with the most loads
(ties by name): a library of thousands of adapters adds at most that many ``adapter`` values;
``/v1/usage`` lists every adapter's figures."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from multilora_studio.deploy import BasePool, replicas_of
from multilora_studio.engine import EngineMetrics
from multilora_studio.engine.outputs import AdapterLoadTimes
from multilora_studio.engine.serving_engine import metrics_of
from multilora_studio.server.usage import UsageCollector, UsageLedger

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5)
LOAD_SERIES_ADAPTERS = 32  # adapters per base and replica with cold-start series


def most_loaded(loads: Sequence[AdapterLoadTimes], limit: int) -> list[AdapterLoadTimes]:
    """The ``limit`` adapters of ``loads`` with the most loads (disk reads and uploads), ties by name."""
    ranked = sorted(loads, key=lambda a: (-(a.disk_to_host.loads + a.host_to_gpu.loads), a.adapter))
    return ranked[:limit]


class EngineCollector(Collector):
    """Reads every loaded base's replicas' ``metrics()`` at scrape time (the snapshots the GUI shows)."""

    def __init__(self, pool: BasePool) -> None:
        self.pool = pool

    def collect(self) -> Iterator[Metric]:
        snaps = [
            ((base, label), metrics_of(replica))
            for base, engine in self.pool.resident()
            for label, replica in replicas_of(engine)
        ]
        snapshots = [(labels, snap) for labels, snap in snaps if snap is not None]
        hits = CounterMetricFamily(
            "multilora_adapter_cache_hits",
            "Adapter lookups served by a tier",
            labels=["base", "replica", "tier"],
        )
        misses = CounterMetricFamily(
            "multilora_adapter_cache_misses",
            "Adapter lookups a tier had to load",
            labels=["base", "replica", "tier"],
        )
        cold = GaugeMetricFamily(
            "multilora_adapter_cold_load_seconds",
            "Adapter load latency from disk",
            labels=["base", "replica", "quantile"],
        )
        upload = GaugeMetricFamily(
            "multilora_adapter_upload_seconds",
            "Adapter upload latency from host RAM into a GPU slot",
            labels=["base", "replica", "quantile"],
        )
        for (base, replica), snap in snapshots:
            for quantile, value in (("0.5", snap.upload_p50_s), ("0.95", snap.upload_p95_s)):
                if value is not None:
                    upload.add_metric([base, replica, quantile], value)
            for tier, hit, miss in (
                ("gpu", snap.gpu_hits, snap.gpu_misses),
                ("cpu", snap.cpu_hits, snap.cpu_misses),
            ):
                hits.add_metric([base, replica, tier], hit)
                misses.add_metric([base, replica, tier], miss)
            for quantile, value in (("0.5", snap.cold_load_p50_s), ("0.95", snap.cold_load_p95_s)):
                if value is not None:
                    cold.add_metric([base, replica, quantile], value)
        yield hits
        yield misses
        yield cold
        yield upload
        yield from adapter_load_families(snapshots)
        for family, table in ((GaugeMetricFamily, GAUGES), (CounterMetricFamily, COUNTERS)):
            for name, documentation, reading in table:
                metric = family(name, documentation, labels=["base", "replica"])
                for labels, snap in snapshots:
                    metric.add_metric(list(labels), reading(snap))
                yield metric


def adapter_load_families(snapshots: Sequence[tuple[tuple[str, str], EngineMetrics]]) -> Iterator[Metric]:
    """Per adapter (``most_loaded``): its loads and their p50 / p95, by tier."""
    seconds = GaugeMetricFamily(
        "multilora_adapter_load_seconds",
        "An adapter's load latency into a tier (disk_to_host, host_to_gpu), over its recent loads",
        labels=["base", "replica", "adapter", "tier", "quantile"],
    )
    count = CounterMetricFamily(
        "multilora_adapter_loads",
        "An adapter's loads into a tier since it was added",
        labels=["base", "replica", "adapter", "tier"],
    )
    for (base, replica), snap in snapshots:
        for loads in most_loaded(snap.adapter_loads, LOAD_SERIES_ADAPTERS):
            for tier, figures in (("disk_to_host", loads.disk_to_host), ("host_to_gpu", loads.host_to_gpu)):
                count.add_metric([base, replica, loads.adapter, tier], figures.loads)
                for quantile, value in (("0.5", figures.p50_s), ("0.95", figures.p95_s)):
                    if value is not None:
                        seconds.add_metric([base, replica, loads.adapter, tier, quantile], value)
    yield seconds
    yield count


Reading = Callable[[EngineMetrics], float]
# name, documentation, its value in one engine snapshot
GAUGES: tuple[tuple[str, str, Reading], ...] = (
    ("multilora_num_requests_waiting", "Requests queued in the engine", lambda s: s.waiting),
    ("multilora_num_requests_running", "Requests in the running batch", lambda s: s.running),
    ("multilora_batch_size", "Requests in the last step", lambda s: s.batch_size),
    ("multilora_batch_tokens", "Tokens in the last step", lambda s: s.batch_tokens),
    (
        "multilora_batch_distinct_adapters",
        "Distinct adapters in the last step",
        lambda s: s.distinct_adapters,
    ),
    ("multilora_generation_tokens_per_second", "Recent generation rate", lambda s: s.tokens_per_second),
    ("multilora_kv_blocks_free", "Free KV cache blocks", lambda s: s.kv_blocks_free),
    ("multilora_kv_blocks_total", "KV cache blocks", lambda s: s.kv_blocks_total),
    (
        "multilora_prefix_cache_blocks",
        "KV cache blocks the prefix cache holds, in use or kept for reuse (0 when it is off)",
        lambda s: s.prefix_cache_blocks or 0,
    ),
    (
        "multilora_gpu_slots_used",
        "Adapter slots holding an adapter",
        lambda s: sum(slot.adapter is not None for slot in s.slots),
    ),
    ("multilora_gpu_slots_total", "Adapter slots", lambda s: len(s.slots)),
    ("multilora_cpu_adapters", "Adapters held in host RAM", lambda s: len(s.cpu_adapters)),
    (
        "multilora_cpu_adapters_capacity",
        "Adapters the host RAM tier holds (max_cpu_loras, or sized from host memory)",
        lambda s: s.cpu_capacity,
    ),
    ("multilora_cpu_adapter_bytes", "Host memory of the adapters in host RAM", lambda s: s.cpu_bytes),
    ("multilora_device_memory_bytes", "Device memory allocated", lambda s: s.device_memory_bytes),
    (
        "multilora_token_tables",
        "Adapters with embedding / lm_head tables on the device",
        lambda s: s.token_tables,
    ),
    (
        "multilora_token_table_bytes",
        "Device memory of the adapters' token tables",
        lambda s: s.token_table_bytes,
    ),
)
COUNTERS: tuple[tuple[str, str, Reading], ...] = (
    ("multilora_engine_steps", "Engine steps run", lambda s: s.steps),
    ("multilora_preemptions", "Requests preempted for KV space", lambda s: s.preemptions),
    (
        "multilora_prefix_cache_queried_tokens",
        "Prompt tokens of requests admitted, looked up in the prefix cache",
        lambda s: s.prefix_cache_queried_tokens,
    ),
    (
        "multilora_prefix_cache_hit_tokens",
        "Prompt tokens found in the prefix cache (their KV not computed again)",
        lambda s: s.prefix_cache_hit_tokens,
    ),
    (
        "multilora_kernel_compiles",
        "Triton kernel compiles after start-up (each stalls the running batch)",
        lambda s: s.kernel_compiles,
    ),
)


class ServerMetrics:
    """One registry per server, so several servers (tests, GUI restarts) never share series."""

    def __init__(self, pool: BasePool, usage: UsageLedger) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["adapter"]
        self.requests = Counter(
            "multilora_requests",
            "Generation requests answered",
            ["adapter", "status"],
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "multilora_prompt_tokens", "Prompt tokens processed", labels, registry=self.registry
        )
        self.generation_tokens = Counter(
            "multilora_generation_tokens", "Tokens generated", labels, registry=self.registry
        )
        self.ttft = Histogram(
            "multilora_time_to_first_token_seconds",
            "Arrival at the server to first token",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.inter_token = Histogram(
            "multilora_inter_token_latency_seconds",
            "Time between consecutive tokens of one request",
            labels,
            buckets=TOKEN_BUCKETS,
            registry=self.registry,
        )
        self.latency = Histogram(
            "multilora_request_latency_seconds",
            "Arrival to last byte",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "multilora_server_in_flight", "Engine requests the server has in flight", registry=self.registry
        )
        self.tenant_ttft = Histogram(
            "multilora_tenant_time_to_first_token_seconds",
            "Arrival at the server to first token, by tenant (API key name)",
            ["tenant"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.tenant_latency = Histogram(
            "multilora_tenant_request_latency_seconds",
            "Arrival to last byte, by tenant",
            ["tenant"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(EngineCollector(pool))
        self.registry.register(UsageCollector(usage))

    def render(self) -> bytes:
        return generate_latest(self.registry)
