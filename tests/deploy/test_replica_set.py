"""Two CPU engine replicas behind the dispatcher: greedy outputs equal one engine's; requests for
an adapter stay on the replica that loaded it (each adapter read from disk once, where
least-loaded routing reads it on both); a hot adapter still spreads beyond the margin; a replica
whose worker dies is taken out, its requests fail naming it and the others carry on; the
OpenAI endpoint over a replica set labels its metrics by replica."""

from __future__ import annotations

import threading
import urllib.request

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from multilora_studio.deploy import ReplicaSet, parse_devices
from multilora_studio.deploy.replica_set import replica_configs
from multilora_studio.engine import Engine, EngineConfig, RequestOutput, SamplingParams
from multilora_studio.server import ApiServer, ServerConfig
from tests.waiting import wait_until

NEW_TOKENS = 8
ADAPTERS = ("tiny-r4-qv", "tiny-r8-all", "tiny-r16-mlp", "tiny-r8-attn")
PROMPTS = [[1, 510, 2300, 44, 901], [1, 40000, 12, 7], [1, 99, 3, 1000, 5, 6]]
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)


def config(tiny_model_dir) -> EngineConfig:
    return EngineConfig(
        model=str(tiny_model_dir),
        device="cpu",
        dtype="float32",
        max_model_len=128,
        max_lora_rank=16,
        max_loras=4,
        max_cpu_loras=8,
    )


def start_set(tiny_model_dir, tiny_adapters, margin: int = 8) -> ReplicaSet:
    replicas = ReplicaSet.start(config(tiny_model_dir), ["cpu", "cpu"], margin)
    for name in ADAPTERS:
        replicas.add_adapter(name, tiny_adapters[name], preload=False)
    return replicas


def mixed_requests() -> list[tuple[list[int], str | None]]:
    return [(prompt, adapter) for adapter in (*ADAPTERS, None) for prompt in PROMPTS]


@pytest.fixture(scope="module")
def single_engine_run(tiny_model_dir, tiny_adapters) -> list[RequestOutput]:
    """One engine's outputs for ``mixed_requests()``."""
    with Engine(config(tiny_model_dir)) as engine:
        for name in ADAPTERS:
            engine.add_adapter(name, tiny_adapters[name])
        requests = mixed_requests()
        return engine.generate([p for p, _ in requests], [a for _, a in requests], GREEDY)


@pytest.fixture(scope="module")
def single_engine_outputs(single_engine_run) -> list[list[int]]:
    return [o.token_ids for o in single_engine_run]


def disk_loads(replicas: ReplicaSet) -> list[int]:
    """Adapter reads from disk per replica (host-tier misses), from each replica's counters."""
    return [replica.metrics(fresh=True).cpu_misses for replica in replicas.replicas]


def burst(replicas: ReplicaSet, requests: list[tuple[list[int], str | None]]) -> list[list[int]]:
    """Submit every request at once (one at a time, as clients do), then wait for all."""
    streams = [replicas.submit(prompt, adapter, GREEDY) for prompt, adapter in requests]
    return [stream.result(timeout=120).token_ids for stream in streams]


def test_two_replicas_equal_one_engine_and_keep_each_adapter_on_one_replica(
    tiny_model_dir, tiny_adapters, single_engine_outputs
):
    with start_set(tiny_model_dir, tiny_adapters) as replicas:
        assert replicas.generate(*zip(*mixed_requests(), strict=True), GREEDY)  # warm-up
        outputs = replicas.generate(
            [p for p, _ in mixed_requests()], [a for _, a in mixed_requests()], GREEDY
        )
        assert [o.token_ids for o in outputs] == single_engine_outputs
        for _ in range(3):  # waves of concurrent requests: the same outputs every time
            assert burst(replicas, mixed_requests()) == single_engine_outputs
        loads = disk_loads(replicas)
        assert sum(loads) == len(ADAPTERS), loads  # each adapter read once, on one replica
        assert all(load > 0 for load in loads)  # and both replicas were used
        held = [set(replica.metrics().cpu_adapters) for replica in replicas.replicas]
        assert not held[0] & held[1] and held[0] | held[1] == set(ADAPTERS)
        assert replicas.loads() == [0, 0]

    # the same trace routed least-loaded (margin 0): adapters are read on both replicas
    with start_set(tiny_model_dir, tiny_adapters, margin=0) as least_loaded:
        for _ in range(3):
            assert burst(least_loaded, mixed_requests()) == single_engine_outputs
        assert sum(disk_loads(least_loaded)) > len(ADAPTERS)


def test_a_hot_adapter_spreads_past_the_margin(tiny_model_dir, tiny_adapters):
    margin = 3
    with start_set(tiny_model_dir, tiny_adapters, margin=margin) as replicas:
        slow = SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True)
        streams = [replicas.submit(PROMPTS[0], "tiny-r8-all", slow) for _ in range(12)]
        placed = [replicas.replica_of(s.request_id) for s in streams]
        for stream in streams:
            assert stream.result(timeout=120).finish_reason == "length"
        assert None not in placed
        counts = [placed.count(0), placed.count(1)]
        # the first replica takes margin + 1 requests before the second gets any; then they
        # alternate, each staying within the margin of the other
        assert placed[: margin + 1] == [placed[0]] * (margin + 1) and min(counts) > 0
        assert abs(counts[0] - counts[1]) <= margin + 1, counts
        assert replicas.dispatched == counts


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the crash itself
def test_a_replica_whose_worker_dies_is_taken_out_and_its_requests_fail(tiny_model_dir, tiny_adapters):
    with start_set(tiny_model_dir, tiny_adapters) as replicas:
        first = replicas.submit(PROMPTS[0], "tiny-r4-qv", GREEDY)
        second = replicas.submit(PROMPTS[1], "tiny-r8-all", GREEDY)  # the other, less loaded
        victim = replicas.replica_of(second.request_id)
        assert victim is not None and victim != replicas.replica_of(first.request_id)

        def crash() -> None:  # the worker thread ends as on a fatal device error
            raise SystemExit

        threading.Thread(target=replicas.replicas[victim].call_on_worker, args=(crash,), daemon=True).start()
        failed = second.result(timeout=30)
        assert failed.finish_reason == "error" and f"replica {victim}" in (failed.error or "")
        assert first.result(timeout=30).finish_reason == "length"
        assert replicas.running
        after = [replicas.submit(p, a, GREEDY) for p, a in mixed_requests()]
        assert {replicas.replica_of(s.request_id) for s in after} <= {1 - victim, None}
        assert all(s.result(timeout=60).finish_reason == "length" for s in after)
        wait_until(lambda: replicas.loads()[1 - victim] == 0, 10)
        replicas.replicas[1 - victim].shutdown()
        assert not replicas.running
        with pytest.raises(RuntimeError, match="every replica"):
            replicas.submit(PROMPTS[0], None, GREEDY)


def test_the_endpoint_over_replicas_answers_and_labels_metrics_by_replica(
    tiny_model_dir, tiny_adapters, single_engine_run
):
    with start_set(tiny_model_dir, tiny_adapters) as replicas:
        server = ApiServer(replicas, ServerConfig(port=0))
        url = server.start()
        try:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
            texts = {
                (tuple(p), a): o.text for (p, a), o in zip(mixed_requests(), single_engine_run, strict=True)
            }
            for adapter in ADAPTERS:
                reply = client.completions.create(
                    model=adapter,
                    prompt=PROMPTS[2],
                    max_tokens=NEW_TOKENS,
                    temperature=0,
                    extra_body={"ignore_eos": True},
                )
                assert reply.choices[0].text == texts[(tuple(PROMPTS[2]), adapter)]
            with urllib.request.urlopen(f"{url}/metrics") as response:
                text = response.read().decode()
            labels = {
                (sample.labels.get("replica"), sample.labels.get("tier"))
                for family in text_string_to_metric_families(text)
                for sample in family.samples
                if sample.name == "multilora_adapter_cache_misses_total"
            }
            assert {("0", "cpu"), ("1", "cpu")} <= labels
        finally:
            server.stop()


def test_devices_are_parsed_and_a_shared_gpu_is_split():
    assert parse_devices("auto") == ["cpu"]  # no GPU here
    assert parse_devices("cpu, cpu") == ["cpu", "cpu"]
    for bad, message in (("gpu0", "cpu or cuda:N entries"), ("cuda:0", "does not"), (" , ", "at least one")):
        with pytest.raises(ValueError, match=message):
            parse_devices(bad)
    shares = [c.device_memory_share for c in replica_configs(EngineConfig(), ["cuda:0", "cuda:0", "cuda:1"])]
    assert shares == [0.5, 0.5, 1.0]
    fixed = replica_configs(EngineConfig(kv_cache_memory_gb=4), ["cuda:0", "cuda:0"])
    assert [(c.device, c.device_memory_share) for c in fixed] == [("cuda:0", 1.0), ("cuda:0", 1.0)]
