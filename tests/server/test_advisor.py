"""The advisor on a recorded trace: Zipf traffic over eight adapters sent through a real server
on an engine with 2 GPU slots; the advisor's replay of the trace predicts the slot hit rate the
engine had within 5 points, and the settings it recommends, replayed through a new engine with
those settings, give the hit rate it predicted for them within 5 points."""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest

from multilora_studio.bench.advisor import advise, parse_trace, replay
from multilora_studio.cli import main
from multilora_studio.engine import Engine, EngineConfig
from multilora_studio.server import ApiServer, ServerConfig
from tests.server_fixtures import GREEDY, client

REQUESTS = 160
KEY = "sk-advisor-admin"


def settings(tiny_model_dir, slots: int, host: int) -> EngineConfig:
    return EngineConfig(model=str(tiny_model_dir), device="cpu", dtype="float32", max_loras=slots,
                        max_cpu_loras=host, max_lora_rank=32, max_model_len=128, cpu_threads=1)  # fmt: skip


def run_trace(tiny_model_dir, adapters, order: list[str], slots: int, host: int) -> str:
    """Send ``order`` one request at a time through a server on a fresh engine; its trace."""
    with (
        Engine(settings(tiny_model_dir, slots, host)) as engine,
        ApiServer(engine, ServerConfig(port=0, api_keys=(KEY,))) as server,
    ):
        for name, path in adapters.items():
            engine.add_adapter(name, path, preload=False)
        openai_client = client(server, KEY)
        for model in order:
            openai_client.completions.create(model=model, prompt="hi", max_tokens=1, **GREEDY)
        request = urllib.request.Request(
            f"{server.url}/v1/usage/trace", headers={"Authorization": f"Bearer {KEY}"}
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.read().decode()


def slot_hit_rate(trace_text: str) -> float:
    tiers = [json.loads(line)["adapter_tier"] for line in trace_text.splitlines()]
    return sum(t == "gpu" for t in tiers) / len(tiers)


@pytest.fixture(scope="module")
def recorded(tiny_model_dir, server_adapters):
    names = sorted(server_adapters)
    weights = 1.0 / np.arange(1, len(names) + 1)  # Zipf(1.0)
    order = list(np.random.default_rng(7).choice(names, REQUESTS, p=weights / weights.sum()))
    return order, run_trace(tiny_model_dir, server_adapters, order, 2, 4)


def test_the_advisors_predictions_hold_in_real_runs(recorded, tiny_model_dir, server_adapters):
    order, text = recorded
    trace = parse_trace(text)
    assert len(trace) == REQUESTS
    predicted, _ = replay(trace, 2, 4, concurrency=1)
    assert abs(predicted.slot_hit_rate - slot_hit_rate(text)) <= 0.05

    advice = advise(trace, max_loras_limit=4, recorded=(2, 4), concurrency=1)
    best = advice.recommended
    assert advice.recorded.max_loras == 2 and best.max_loras <= 4
    assert best.slot_hit_rate > advice.recorded.slot_hit_rate  # more slots than 2 pay off here
    assert best.disk_loads_per_1000 <= advice.recorded.disk_loads_per_1000
    again = run_trace(tiny_model_dir, server_adapters, order, best.max_loras, best.max_cpu_loras)
    assert abs(best.slot_hit_rate - slot_hit_rate(again)) <= 0.05, (best, slot_hit_rate(again))


def test_advise_from_the_command_line(recorded, tmp_path, capsys):
    path = tmp_path / "trace.jsonl"
    path.write_text(recorded[1])
    assert (
        main(
            [
                "advise",
                "--trace",
                str(path),
                "--recorded",
                "2:4",
                "--concurrency",
                "1",
                "--max-loras-limit",
                "4",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.startswith(f"{REQUESTS} requests, 8 adapters") and "recommended" in out and "recorded" in out
    assert main(["advise", "--trace", str(path), "--json", "--concurrency", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["requests"] == REQUESTS
    path.write_text("not json\n")
    assert main(["advise", "--trace", str(path)]) == 1
    assert "not a request of /v1/usage/trace" in capsys.readouterr().err
