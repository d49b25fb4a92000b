"""Refused requests cannot add Prometheus series: a label is a served name or ``unknown``."""

from __future__ import annotations

import uuid

from prometheus_client.parser import text_string_to_metric_families

from tests.adapters.hub_server import free_port, point_client_at
from tests.server.raw_http import call, post_json
from tests.server_fixtures import client

ADMIN_KEY = "sk-admin-key-00001"
REQUESTS = 100


def scrape(server) -> str:
    status, _, text = call(server.url, "GET", "/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert status == 200
    return str(text)


def request_labels(text: str) -> dict[tuple[str, str], float]:
    """``multilora_requests_total`` by (adapter, status)."""
    found: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "multilora_requests_total":
                found[(sample.labels["adapter"], sample.labels["status"])] = sample.value
    return found


def test_refused_requests_with_made_up_models_add_no_series(serve, registry, monkeypatch, tmp_path):
    unanswered = f"http://127.0.0.1:{free_port()}"  # a Hub that does not answer
    point_client_at(monkeypatch, unanswered, tmp_path / "hf-cache", offline=False)
    server = serve(api_keys=(ADMIN_KEY,), allow_hub_adapters=True, registry=registry)
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    made_up = [f"made-up/model-{uuid.uuid4().hex}" for _ in range(REQUESTS)]
    for model in made_up[: REQUESTS // 2]:  # refused before the model is looked at
        status, _, _ = post_json(server.url, "/v1/responses", {"model": model, "input": []}, auth)
        assert status == 400
    for model in made_up[REQUESTS // 2 :]:  # its pull fails: the Hub is unreachable
        status, _, _ = post_json(server.url, "/v1/completions", {"model": model, "prompt": "Hi"}, auth)
        assert status == 502
    text = scrape(server)
    assert not [model for model in made_up if model in text]
    labels = request_labels(text)
    assert labels[("unknown", "400")] == REQUESTS // 2
    assert labels[("unknown", "502")] == REQUESTS - REQUESTS // 2
    served = client(server, api_key=ADMIN_KEY).completions.create(
        model="tiny-r4-qv", prompt="Hi", max_tokens=1
    )
    assert served.usage.completion_tokens == 1
    assert request_labels(scrape(server))[("tiny-r4-qv", "200")] == 1  # served names still label
