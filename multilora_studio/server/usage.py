"""Usage by tenant and model: every answered request attributed to its API key's name (the
tenant) and the model it named, with its tokens, latency, cold start and share of the engine's
busy time; ``/v1/usage``, its CSV, the ``multilora_tenant_*`` series and the window's table.

A request's engine seconds are its share of each step it ran in, split by tokens (the engine's
``RequestOutput.engine_seconds``), so the tenants' sum is the engine's busy time for the requests
this server sent. A request is cold when its adapter had to be read from disk ("disk", or a read
already in flight: "loading") when it arrived; its cold wait is its time in the queue.

Cardinality of the series: ``tenant`` takes one value per configured key (plus ``anonymous``
without keys) and ``model`` one per served base or adapter (a request for a model that is not
served counts as ``unknown``), so a client cannot create series.
"""

from __future__ import annotations

import csv
import io
import json
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, fields, replace

import numpy as np
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from multilora_studio.engine.outputs import ADAPTER_TIERS
from multilora_studio.server.request_log import RequestRecord

COLD_TIERS = ADAPTER_TIERS[:2]  # not in host RAM or a slot when the request came: read from disk
UNKNOWN_MODEL = "unknown"


@dataclass(frozen=True)
class UsageRow:
    """One (tenant, model)'s requests over a period."""

    tenant: str
    model: str
    requests: int
    errors: int  # answered with a status other than 200 (refusals, limits, failures, clients gone)
    prompt_tokens: int
    completion_tokens: int
    engine_seconds: float
    cold_requests: int
    cold_wait_s: float  # summed queue time of the cold requests
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    latency_p50_s: float | None
    latency_p95_s: float | None
    cold_ttft_p95_s: float | None  # the published cold-start figure, per tenant and model

    def cost(self, price_per_gpu_hour: float) -> float:
        """Its engine time at ``price_per_gpu_hour``."""
        return self.engine_seconds / 3600.0 * price_per_gpu_hour


@dataclass
class _Totals:
    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    engine_seconds: float = 0.0
    cold_requests: int = 0
    cold_wait_s: float = 0.0


def is_cold(record: RequestRecord) -> bool:
    return record.adapter_tier in COLD_TIERS


def _quantile(values: list[float], q: float) -> float | None:
    return float(np.quantile(values, q)) if values else None


class UsageLedger:
    """The records of the last ``maxlen`` requests (for ``since`` queries) and all-time totals
    per (tenant, model) (for the Prometheus counters); thread-safe."""

    def __init__(self, maxlen: int = 100_000) -> None:
        self._lock = threading.Lock()
        self._records: deque[RequestRecord] = deque(maxlen=maxlen)
        self._totals: dict[tuple[str, str], _Totals] = {}
        self._dropped = 0  # records that left the window (the oldest retained is later)
        self.version = 0  # counts the records added: a view re-reads only when it moved

    def add(self, record: RequestRecord, served: bool) -> None:
        """Count ``record``; ``served``: whether its model is one the server serves (else it
        counts as ``unknown``)."""
        if not served and record.model != UNKNOWN_MODEL:
            record = replace(record, model=UNKNOWN_MODEL)
        with self._lock:
            if len(self._records) == self._records.maxlen:
                self._dropped += 1
            self._records.append(record)
            self.version += 1
            totals = self._totals.setdefault((record.api_key, record.model), _Totals())
            totals.requests += 1
            totals.errors += record.status != 200
            totals.prompt_tokens += record.prompt_tokens
            totals.completion_tokens += record.completion_tokens
            totals.engine_seconds += record.engine_seconds
            if is_cold(record):
                totals.cold_requests += 1
                totals.cold_wait_s += record.queue_s or 0.0

    def complete_since(self, since: float | None) -> bool:
        """Whether every request since ``since`` (wall clock; None: ever) is still held."""
        with self._lock:
            if not self._dropped:
                return True
            return since is not None and bool(self._records) and self._records[0].time <= since

    def rows(self, since: float | None = None) -> list[UsageRow]:
        """Per (tenant, model) over the records since ``since`` (wall clock), sorted."""
        with self._lock:
            records = [r for r in self._records if since is None or r.time >= since]
        groups: dict[tuple[str, str], list[RequestRecord]] = {}
        for record in records:
            groups.setdefault((record.api_key, record.model), []).append(record)
        return [summarize(tenant, model, group) for (tenant, model), group in sorted(groups.items())]

    def records(self, since: float | None = None) -> list[RequestRecord]:
        """The requests held since ``since`` (wall clock), oldest first: the recorded traffic."""
        with self._lock:
            return [r for r in self._records if since is None or r.time >= since]

    def totals(self) -> dict[tuple[str, str], _Totals]:
        with self._lock:
            return {key: _Totals(**asdict(value)) for key, value in self._totals.items()}


def summarize(tenant: str, model: str, records: list[RequestRecord]) -> UsageRow:
    answered = [r for r in records if r.status == 200]
    cold = [r for r in records if is_cold(r)]
    return UsageRow(
        tenant=tenant,
        model=model,
        requests=len(records),
        errors=len(records) - len(answered),
        prompt_tokens=sum(r.prompt_tokens for r in records),
        completion_tokens=sum(r.completion_tokens for r in records),
        engine_seconds=sum(r.engine_seconds for r in records),
        cold_requests=len(cold),
        cold_wait_s=sum(r.queue_s or 0.0 for r in cold),
        ttft_p50_s=_quantile([r.ttft_s for r in answered if r.ttft_s is not None], 0.5),
        ttft_p95_s=_quantile([r.ttft_s for r in answered if r.ttft_s is not None], 0.95),
        latency_p50_s=_quantile([r.latency_s for r in answered], 0.5),
        latency_p95_s=_quantile([r.latency_s for r in answered], 0.95),
        cold_ttft_p95_s=_quantile([r.ttft_s for r in cold if r.status == 200 and r.ttft_s is not None], 0.95),
    )


TRACE_FIELDS = ("time", "tenant", "model", "adapter", "status", "adapter_tier", "queue_s", "ttft_s",
                "latency_s", "prompt_tokens", "completion_tokens", "engine_seconds")  # fmt: skip


def trace_lines(records: Iterable[RequestRecord]) -> str:
    """The requests as JSON lines (``TRACE_FIELDS``; ``tenant`` is the key's name): what
    ``multilora-studio advise --trace`` replays."""
    lines = []
    for r in records:
        values = (r.time, r.api_key, r.model, r.adapter, r.status, r.adapter_tier, r.queue_s, r.ttft_s,
                  r.latency_s, r.prompt_tokens, r.completion_tokens, r.engine_seconds)  # fmt: skip
        lines.append(json.dumps(dict(zip(TRACE_FIELDS, values, strict=True))))
    return "".join(line + "\n" for line in lines)


def rows_csv(rows: Iterable[UsageRow]) -> str:
    """The rows as CSV with a header (the fields' names)."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow([f.name for f in fields(UsageRow)])
    for row in rows:
        writer.writerow(["" if value is None else value for value in asdict(row).values()])
    return out.getvalue()


class UsageCollector(Collector):
    """The ledger's all-time totals as ``multilora_tenant_*`` counters."""

    SERIES = (
        ("requests", "Requests answered, by tenant (API key name) and model"),
        ("errors", "Requests answered with a status other than 200"),
        ("prompt_tokens", "Prompt tokens"),
        ("completion_tokens", "Generated tokens"),
        ("engine_seconds", "The requests' share of the engine's busy time, split by tokens"),
        ("cold_requests", "Requests whose adapter was read from disk"),
        ("cold_wait_s", "Queue seconds of the cold requests"),
    )

    def __init__(self, ledger: UsageLedger) -> None:
        self.ledger = ledger

    def collect(self) -> Iterator[CounterMetricFamily]:
        totals = self.ledger.totals()
        for name, doc in self.SERIES:
            family = CounterMetricFamily(f"multilora_tenant_{name}", doc, labels=["tenant", "model"])
            for (tenant, model), value in sorted(totals.items()):
                family.add_metric([tenant, model], getattr(value, name))
            yield family
