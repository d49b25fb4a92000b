"""The timing hooks of engine/loop/diagnostics.py and the worker call they run through."""

from __future__ import annotations

import os
import threading

import pytest

from multilora_studio.engine import SamplingParams
from multilora_studio.engine.loop.diagnostics import step_profile, time_decode_graph, time_slot_upload

ON_CUDA = os.environ.get("MULTILORA_TEST_DEVICE", "cpu") == "cuda"


def test_call_on_worker_runs_there_and_a_failure_leaves_the_worker_running(make_engine):
    engine = make_engine(adapters=["tiny-r4-qv"])
    assert engine.call_on_worker(lambda: threading.current_thread().name) == "engine-worker"
    with pytest.raises(ZeroDivisionError):
        engine.call_on_worker(lambda: 1 / 0)
    assert engine.running
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    assert len(engine.generate([[5, 6, 7]], ["tiny-r4-qv"], params)[0].token_ids) == 3
    profile = step_profile(engine)
    assert set(profile) == {"schedule", "prepare", "launch", "sample", "postprocess", "steps"}
    assert profile["steps"] >= 3 and all(seconds >= 0 for seconds in profile.values())


@pytest.mark.skipif(ON_CUDA, reason="the refusals of a CPU engine")
def test_graph_and_upload_timing_need_cuda(make_engine):
    engine = make_engine(adapters=["tiny-r4-qv"])
    engine.generate([[5, 6, 7]], ["tiny-r4-qv"], SamplingParams(max_tokens=2, temperature=0))
    with pytest.raises(ValueError, match="decode graphs are not in use"):
        time_decode_graph(engine, 4, True)
    with pytest.raises(ValueError, match="resident in a GPU slot and host RAM, idle, on CUDA"):
        time_slot_upload(engine, "tiny-r4-qv")


@pytest.mark.skipif(not ON_CUDA, reason="CUDA graphs and uploads on a side stream")
def test_graph_and_upload_timing_on_cuda(make_engine):
    engine = make_engine(adapters=["tiny-r4-qv"])
    engine.generate([[5, 6, 7]], ["tiny-r4-qv"], SamplingParams(max_tokens=2, temperature=0))
    for uses_lora in (False, True):
        assert time_decode_graph(engine, 3, uses_lora, iters=5) > 0
    upload = time_slot_upload(engine, "tiny-r4-qv")
    assert upload["upload_ms"] > 0 and upload["pinned_copy_ms"] > 0 and upload["bytes"] > 0
