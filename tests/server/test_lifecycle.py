"""Start/stop in-process, busy ports, client disconnects, adapter (un)loading while serving, metrics, log."""

from __future__ import annotations

import json
import socket
import threading

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from multilora_studio.engine import SamplingParams
from multilora_studio.server import ApiServer, PortInUseError, ServerConfig
from tests.server.raw_http import call, connect, post_json
from tests.server_fixtures import GREEDY, client
from tests.waiting import wait_until

LONG = {"max_tokens": 900, **GREEDY}


def engine_idle(engine) -> bool:
    snap = engine.metrics()
    return (
        snap is not None
        and snap.running == 0
        and snap.waiting == 0
        and snap.kv_blocks_free == snap.kv_blocks_total
    )


def test_start_stop_restart_frees_the_port_and_keeps_the_engine(engine):
    server = ApiServer(engine, ServerConfig(port=0))
    url = server.start()
    port = int(url.rsplit(":", 1)[1])
    assert client(server).completions.create(model="tiny-r4-qv", prompt="Hi", max_tokens=2).usage
    server.stop()
    assert not server.running
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2)
    again = ApiServer(engine, ServerConfig(port=port))  # the port is free again
    assert again.start() == f"http://127.0.0.1:{port}"
    again.stop()
    server.start()  # the same object toggles on again, over the same engine and adapters
    assert len(client(server).models.list().data) == 9
    server.stop()
    server.stop()  # stopping twice is harmless


def test_busy_port_is_a_clear_error(serve, engine):
    running = serve()
    port = int(running.url.rsplit(":", 1)[1])
    with pytest.raises(PortInUseError, match=f"127.0.0.1:{port} is already in use"):
        ApiServer(engine, ServerConfig(port=port)).start()
    assert client(running).models.list().data  # the first server is untouched


def test_client_disconnect_mid_stream_aborts_and_frees_kv_blocks(serve, engine):
    server = serve()
    stream = client(server).chat.completions.create(
        model="tiny-r8-all", messages=[{"role": "user", "content": "Hi"}], stream=True, **LONG
    )
    pieces = iter(stream)
    for _ in range(5):
        next(pieces)
    snap = engine.metrics()
    assert snap.kv_blocks_free < snap.kv_blocks_total
    stream.close()
    wait_until(lambda: engine_idle(engine), 10, "the aborted request's KV blocks to be freed")
    record = server.request_log.records()[-1]
    assert record.status == 499 and record.stream and record.adapter == "tiny-r8-all"
    assert 4 <= record.completion_tokens < 900  # the first chunk only names the role


def test_client_disconnect_while_waiting_for_a_whole_answer(serve, engine):
    server = serve()
    conn = connect(server.url)
    payload = json.dumps(
        {"model": "tiny-r4-qv", "prompt": "Hi", "max_tokens": 900, "temperature": 0, "ignore_eos": True}
    )
    conn.request("POST", "/v1/completions", payload.encode(), {"Content-Type": "application/json"})
    wait_until(lambda: engine.metrics().running == 1, 10, "the request to run")
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    wait_until(lambda: engine_idle(engine), 10, "the aborted request's KV blocks to be freed")
    wait_until(lambda: len(server.request_log.records()) > 0, 5, "the request log entry")
    record = server.request_log.records()[-1]
    assert record.status == 499 and not record.stream and record.completion_tokens < 900


def test_stop_aborts_requests_in_flight(serve, engine):
    # A graceful period longer than the stream: a stop that waited instead of aborting would
    # leave the stream running until it ends or the client gives up.
    server = serve(graceful_shutdown_s=3600)
    stream = client(server).completions.create(model="tiny-r16-mlp", prompt="Hi", stream=True, **LONG)
    pieces = iter(stream)
    next(pieces)
    server.stop()
    with pytest.raises((openai.APIError, openai.APIConnectionError)):
        for _ in pieces:
            pass
    wait_until(lambda: engine_idle(engine), 10, "the engine to be idle")
    (record,) = server.request_log.records()
    # aborted by the server (503), not ended by the client giving up (499) or run to its end
    assert record.stream and record.status == 503 and record.completion_tokens < 900


def test_load_and_unload_adapters_while_serving(serve, engine, server_adapters):
    server = serve()
    api = client(server)
    busy = api.completions.create(model="tiny-r8-qo", prompt="Hi", stream=True, **LONG)
    next(iter(busy))
    status, _, text = post_json(
        server.url,
        "/v1/load_lora_adapter",
        {"lora_name": "fresh", "lora_path": str(server_adapters["tiny-r8-all"])},
    )
    assert status == 200 and "fresh" in text
    assert "fresh" in [m.id for m in api.models.list().data]
    answer = api.completions.create(model="fresh", prompt="Sea", max_tokens=8, **GREEDY).choices[0].text
    expected = engine.generate(
        ["Sea"], ["tiny-r8-all"], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    )
    assert answer == expected[0].text
    status, _, body = post_json(server.url, "/v1/unload_lora_adapter", {"lora_name": "tiny-r8-qo"})
    assert status == 409 and "used by" in body["error"]["message"]
    status, _, body = post_json(
        server.url, "/v1/load_lora_adapter", {"lora_name": "fresh", "lora_path": "/nope"}
    )
    assert status == 400 and "already exists" in body["error"]["message"]
    status, _, body = post_json(
        server.url, "/v1/load_lora_adapter", {"lora_name": "bad", "lora_path": "/nope"}
    )
    assert status == 400 and body["error"]["code"] == "invalid_adapter"
    status, _, _ = post_json(server.url, "/v1/unload_lora_adapter", {"lora_name": "fresh"})
    assert status == 200
    with pytest.raises(openai.NotFoundError):
        api.completions.create(model="fresh", prompt="Sea", max_tokens=2)
    status, _, body = post_json(server.url, "/v1/unload_lora_adapter", {"lora_name": "fresh"})
    assert status == 404 and body["error"]["code"] == "model_not_found"
    busy.close()
    wait_until(lambda: engine_idle(engine), 10, "the busy stream to end")
    assert "tiny-r8-qo" in [m.id for m in api.models.list().data]


def test_metrics_report_adapters_cache_and_queue(serve, engine_device):
    server = serve()
    api = client(server)
    for model in ("tiny-r4-qv", "tiny-r4-qv", "tiny-r16-vup"):
        api.completions.create(model=model, prompt="Hi", max_tokens=4, **GREEDY)
    with pytest.raises(openai.NotFoundError):
        api.completions.create(model="missing", prompt="Hi", max_tokens=4)
    status, headers, text = call(server.url, "GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    assert samples[("multilora_requests_total", (("adapter", "tiny-r4-qv"), ("status", "200")))] == 2
    assert samples[("multilora_requests_total", (("adapter", "unknown"), ("status", "404")))] == 1
    assert samples[("multilora_generation_tokens_total", (("adapter", "tiny-r16-vup"),))] == 4
    assert samples[("multilora_time_to_first_token_seconds_count", (("adapter", "tiny-r4-qv"),))] == 2
    assert samples[("multilora_inter_token_latency_seconds_count", (("adapter", "tiny-r4-qv"),))] == 6
    # engine series are labelled by their base model and replica (one engine: replica "0")
    base = (("base", server.pool.primary), ("replica", "0"))
    assert samples[("multilora_adapter_cache_hits_total", (*base, ("tier", "gpu")))] >= 1
    for name in ("multilora_num_requests_waiting", "multilora_batch_size", "multilora_kv_blocks_free"):
        assert (name, base) in samples
    assert ("multilora_adapter_cache_misses_total", (*base, ("tier", "cpu"))) in samples
    snapshot = server.pool.base(server.pool.primary).engine.metrics(fresh=True)
    # compiles since the engine's start: the session's engine has served other tests' requests
    assert samples[("multilora_kernel_compiles_total", base)] == snapshot.kernel_compiles
    if engine_device == "cpu":
        assert snapshot.kernel_compiles == 0  # no Triton kernel runs on the CPU
    assert samples[("multilora_cpu_adapters", base)] == len(snapshot.cpu_adapters) >= 2
    # the host tier sized from free memory: never below twice the 8 GPU slots
    assert samples[("multilora_cpu_adapters_capacity", base)] == snapshot.cpu_capacity >= 2 * 8
    assert samples[("multilora_cpu_adapter_bytes", base)] == snapshot.cpu_bytes > 0


def test_request_log_is_bounded_and_calls_subscribers(serve):
    server = serve(request_log_size=3)
    seen = []
    done = threading.Event()

    def listener(record):
        seen.append(record)
        if len(seen) == 2:
            done.set()

    unsubscribe = server.request_log.subscribe(listener)
    api = client(server)
    api.completions.create(model="tiny-r4-qv", prompt="Hi", max_tokens=3, **GREEDY)
    with pytest.raises(openai.NotFoundError):
        api.completions.create(model="nobody", prompt="Hi")
    assert done.wait(5)
    ok, missing = seen
    assert (ok.adapter, ok.status, ok.completion_tokens, ok.route) == ("tiny-r4-qv", 200, 3, "completions")
    assert ok.prompt_tokens > 0 and ok.latency_s > 0 and ok.ttft_s is not None and ok.api_key == "anonymous"
    assert (missing.model, missing.status) == ("nobody", 404)
    unsubscribe()
    for _ in range(3):
        api.chat.completions.create(
            model="tiny-r4-qv", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
    assert len(seen) == 2
    records = server.request_log.records()
    assert len(records) == 3 and all(r.route == "chat" for r in records)
