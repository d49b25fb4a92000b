"""``bench --endpoint`` against our OpenAI-compatible server on a loopback port."""

from __future__ import annotations

import json

import pytest

from multilora_studio.cli import main
from multilora_studio.engine import Engine, EngineConfig
from multilora_studio.server import ApiServer, ServerConfig
from tests.bench.test_bench_command import check_case

API_KEY = "bench-test-key"


@pytest.fixture
def server(tiny_model_dir, tiny_adapters):
    config = EngineConfig(
        model=str(tiny_model_dir),
        device="cpu",
        dtype="float32",
        max_loras=4,
        max_lora_rank=32,
        max_num_seqs=8,
        max_model_len=256,
        max_num_batched_tokens=256,
    )
    with Engine(config) as engine:
        for name, folder in tiny_adapters.items():
            engine.add_adapter(name, folder)
        api = ApiServer(engine, ServerConfig(port=0, api_keys=(API_KEY,)))
        api.start()
        try:
            yield api
        finally:
            api.stop()


def test_endpoint_run_measures_through_http(capsys, server, tiny_adapters, tmp_path):
    report_path = tmp_path / "endpoint.json"
    common = ["bench", "--endpoint", server.url, "--api-key", API_KEY, "--no-progress"]
    code = main(
        [
            *common,
            "--batch",
            "4",
            "--pattern",
            "distinct,base",
            "--input-len",
            "4:8",
            "--output-len",
            "3:5",
            "--sweep-adapters",
            "5",
            "--requests",
            "6",
            "--ttft-slo-ms",
            "60000",
            "--json",
            str(report_path),
        ]
    )
    assert code == 0, capsys.readouterr().err
    table = capsys.readouterr().out
    report = json.loads(report_path.read_text())
    assert report["engine"]["adapters_served"] == len(tiny_adapters)
    assert report["options"]["api_key"] == "***"
    assert [c["name"] for c in report["cases"]] == ["distinct b=4", "base b=4", "sweep n=5"]
    for case in report["cases"]:
        check_case(case)  # token counts come from the usage record of each stream
        assert "engine" not in case
    assert report["cases"][0]["distinct_adapters"] == 4
    assert f"endpoint {server.url}" in table
    # the server saw the adapters by name in the `model` field, and the base model for base rows
    seen = {record.model for record in server.request_log.records()}
    assert set(tiny_adapters) >= seen - {report["engine"]["model"]}
    assert report["engine"]["model"] in seen and len(seen & set(tiny_adapters)) >= 4


def test_endpoint_needs_enough_adapters_and_a_key(capsys, server):
    base = ["bench", "--endpoint", server.url, "--no-progress", "--pattern", "distinct"]
    assert main([*base, "--api-key", API_KEY, "--batch", "8"]) == 1
    assert "need 8 adapters but" in capsys.readouterr().err
    assert main([*base, "--batch", "2"]) == 1
    assert "401" in capsys.readouterr().err
