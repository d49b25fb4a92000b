"""Usage by tenant: two tenants' interleaved traffic through the official client; /v1/usage
counts each tenant's requests and tokens as they were sent and answered, the engine seconds of
all requests add up to the engine's busy time, a cold adapter's first request is counted cold,
one tenant over its token budget gets 429s while the other is served, and the same totals are
on /metrics by tenant and model, and in the CSV; the cold adapter's own load figures are listed
per adapter, and /metrics carries them for the most loaded adapters only."""

from __future__ import annotations

import csv
import io
import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import openai
import pytest

from multilora_studio.adapters.load_latency import LoadQuantiles
from multilora_studio.engine.outputs import AdapterLoadTimes
from multilora_studio.server.api_keys import USER, ApiKey
from multilora_studio.server.metrics import LOAD_SERIES_ADAPTERS, adapter_load_families
from tests.server_fixtures import GREEDY, client

ADMIN = "sk-usage-admin"
TENANTS = {"team-a": "sk-usage-team-a", "team-b": "sk-usage-team-b"}
COLD = "cold-usage"
MAX_TOKENS = 6


def get(server, path: str, key: str) -> tuple[int, bytes]:
    request = urllib.request.Request(f"{server.url}{path}", headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def send(server, tenant: str, model: str) -> tuple[int, int, int]:
    """(status, prompt tokens, completion tokens) of one completion from ``tenant``."""
    try:
        reply = client(server, TENANTS[tenant]).completions.create(
            model=model, prompt="count to five", max_tokens=MAX_TOKENS, **GREEDY
        )
    except openai.RateLimitError:
        return 429, 0, 0
    return 200, reply.usage.prompt_tokens, reply.usage.completion_tokens


@pytest.fixture
def cold_adapter(engine, server_adapters):
    """An adapter added without reading its weights (its first request reads them from disk)."""
    engine.add_adapter(COLD, server_adapters["tiny-r8-all"], preload=False)
    yield COLD
    engine.remove_adapter(COLD)


def test_usage_by_tenant_adds_up(serve, engine, cold_adapter):
    keys = [ApiKey(secret, USER, None, name) for name, secret in TENANTS.items()]
    # about 10 tokens a request: team-a's 24 exceed the budget, team-b's 7 do not
    server = serve(api_keys=(ADMIN, *keys), tokens_per_minute_per_key=110)
    busy_before = engine.metrics(fresh=True).busy_seconds
    plan = [("team-b", COLD)] + [
        (tenant, model)
        for i in range(24)
        for tenant, model in (("team-a", ["tiny-r4-qv", "tiny-r8-all", engine.model_name][i % 3]),)
        + ((("team-b", "tiny-r16-mlp"),) if i % 4 == 0 else ())
    ]
    first = send(server, *plan[0])  # alone, so it is the request that reads the cold adapter
    with ThreadPoolExecutor(4) as pool:
        rest = list(pool.map(lambda item: send(server, *item), plan[1:]))
    answers = [first, *rest]
    busy = engine.metrics(fresh=True).busy_seconds - busy_before

    status, body = get(server, "/v1/usage", ADMIN)
    assert status == 200
    usage = json.loads(body)
    assert usage["complete"] and usage["bases"][0]["busy_seconds"] >= busy
    base = usage["bases"][0]  # the cold adapter was read from disk, then uploaded into a slot
    assert base["cold_load_disk_to_host_p95_s"] > 0 and base["upload_host_to_gpu_p95_s"] > 0
    assert base["upload_host_to_gpu_p50_s"] <= base["upload_host_to_gpu_p95_s"]
    rows = {(row["tenant"], row["model"]): row for row in usage["data"]}
    for (tenant, model), row in rows.items():
        sent = [a for (t, m), a in zip(plan, answers, strict=True) if (t, m) == (tenant, model)]
        assert row["requests"] == len(sent)
        assert row["errors"] == sum(status != 200 for status, _, _ in sent)
        assert row["prompt_tokens"] == sum(p for _, p, _ in sent)
        assert row["completion_tokens"] == sum(c for _, _, c in sent)
    assert {tenant for tenant, _ in rows} == set(TENANTS)
    limited = [
        status for (tenant, _), (status, _, _) in zip(plan, answers, strict=True) if tenant == "team-a"
    ]
    assert 429 in limited and limited.count(200) >= 3  # over its budget, after some answers
    assert all(
        status == 200 for (tenant, _), (status, _, _) in zip(plan, answers, strict=True) if tenant == "team-b"
    )
    # every answered request ran in the engine; their shares add up to its busy time
    billed = sum(row["engine_seconds"] for row in usage["data"])
    assert billed == pytest.approx(busy, rel=0.01) and billed > 0
    assert rows[("team-b", COLD)]["cold_requests"] == 1 and rows[("team-b", COLD)]["cold_ttft_p95_s"] > 0
    assert all(row["cold_requests"] == 0 for key, row in rows.items() if key != ("team-b", COLD))
    adapters = {row["adapter"]: row for row in usage["adapters"]}
    cold = adapters[COLD]  # read from disk once (its first request), then uploaded into a slot
    assert cold["base"] == base["base"] and cold["disk_to_host"]["loads"] == 1
    assert cold["disk_to_host"]["p50_s"] == cold["disk_to_host"]["p95_s"] > 0
    assert cold["host_to_gpu"]["loads"] >= 1 and cold["host_to_gpu"]["p95_s"] > 0

    status, body = get(server, "/metrics", ADMIN)
    text = body.decode()
    line = 'multilora_tenant_requests_total{model="tiny-r16-mlp",tenant="team-b"} '
    assert f"{line}{float(rows[('team-b', 'tiny-r16-mlp')]['requests'])}" in text
    assert 'multilora_tenant_request_latency_seconds_count{tenant="team-a"}' in text
    assert 'multilora_adapter_upload_seconds{base="' in text
    disk = f'{{adapter="{COLD}",base="{base["base"]}",replica="0",tier="disk_to_host"}}'
    assert f"multilora_adapter_loads_total{disk} 1.0" in text
    p95 = f'{{adapter="{COLD}",base="{base["base"]}",quantile="0.95",replica="0",tier="disk_to_host"}}'
    assert f"multilora_adapter_load_seconds{p95} {cold['disk_to_host']['p95_s']}" in text

    status, body = get(server, "/v1/usage?format=csv", ADMIN)
    table = list(csv.DictReader(io.StringIO(body.decode())))
    assert status == 200 and len(table) == len(rows)
    assert {(r["tenant"], r["model"]): int(r["requests"]) for r in table} == {
        key: row["requests"] for key, row in rows.items()
    }
    later = json.loads(get(server, "/v1/usage?since=4102444800", ADMIN)[1])  # the year 2100
    assert later["data"] == [] and later["complete"]
    assert get(server, "/v1/usage", TENANTS["team-a"])[0] == 403  # admin keys only
    assert get(server, "/v1/usage?format=xml", ADMIN)[0] in (400, 422)


def test_per_adapter_load_series_are_the_most_loaded_adapters_only(engine):
    snap = engine.metrics(fresh=True)
    loads = tuple(
        AdapterLoadTimes(f"a{i:02d}", LoadQuantiles(i, 0.01, 0.02), LoadQuantiles(i % 3, 0.001, 0.002))
        for i in range(40)
    )
    families = list(adapter_load_families([(("base", "0"), replace(snap, adapter_loads=loads))]))
    # i + i % 3 loads: a00-a07 have 0-8, every later one at least 9
    expected = {f"a{i:02d}" for i in range(8, 40)}
    assert len(expected) == LOAD_SERIES_ADAPTERS
    for family in families:
        assert {sample.labels["adapter"] for sample in family.samples} == expected
    (count,) = [f for f in families if f.name == "multilora_adapter_loads"]
    assert len(count.samples) == 2 * LOAD_SERIES_ADAPTERS  # both tiers of each
