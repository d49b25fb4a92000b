"""Loader threads cap their own torch CPU threads and leave everyone else's alone."""

from __future__ import annotations

import threading

import pytest
import torch

from multilora_studio.adapters.short_lived_workers import call_on_short_lived_thread
from multilora_studio.engine import EngineConfig, SamplingParams
from multilora_studio.engine.config import usable_cores
from multilora_studio.engine.residency.host_threads import LOADER_TORCH_THREADS, loader_threads
from tests.threads import CheckedThread, run_threads

WAIT_S = 10


def threads_of_a_new_thread() -> int:
    seen: list[int] = []
    run_threads(CheckedThread(lambda: seen.append(torch.get_num_threads())))
    return seen[0]


def test_loader_cap_holds_inside_and_is_undone_for_other_threads():
    before_main, before_new = torch.get_num_threads(), threads_of_a_new_thread()
    inside: list[int] = []

    def load() -> None:
        with loader_threads("cpu"):
            inside.append(torch.get_num_threads())
            torch.ones(1 << 16).sum()  # a parallel region under the cap

    call_on_short_lived_thread(load)
    assert inside == [LOADER_TORCH_THREADS["cpu"]]
    assert torch.get_num_threads() == before_main
    assert threads_of_a_new_thread() == before_new  # torch's default for fresh threads restored


def test_overlapping_loads_set_the_count_back_once_the_last_ends():
    saved = torch.get_num_threads()
    torch.set_num_threads(LOADER_TORCH_THREADS["cpu"] + 1)  # new threads' default, above the cap
    try:
        check_overlapping_loads()
    finally:
        torch.set_num_threads(saved)


def check_overlapping_loads() -> None:
    before_new = threads_of_a_new_thread()
    assert before_new == LOADER_TORCH_THREADS["cpu"] + 1
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()

    def first() -> None:
        with loader_threads("cpu"):
            first_in.set()
            assert second_in.wait(WAIT_S)
        first_out.set()

    def second() -> None:
        assert first_in.wait(WAIT_S)
        with loader_threads("cpu"):  # starts while the first holds the cap
            second_in.set()
            assert first_out.wait(WAIT_S)
            assert torch.get_num_threads() == LOADER_TORCH_THREADS["cpu"]

    run_threads(CheckedThread(first), CheckedThread(second))  # an assert in either fails the test
    assert threads_of_a_new_thread() == before_new


def test_cpu_engine_keeps_its_threads_after_adapter_loads(make_engine, tiny_adapters):
    engine = make_engine(device="cpu")  # adds every fixture adapter (read and packed on loader threads)
    assert len(engine.list_adapters()) == len(tiny_adapters)
    assert engine.cpu_threads == max(1, usable_cores() - 1)  # the automatic count, in the worker
    # threads started later take the engine's count (torch's last count set); the loads'
    # caps were undone
    assert threads_of_a_new_thread() == engine.cpu_threads


@pytest.mark.parametrize("threads", [1, 3])
def test_the_worker_runs_its_steps_on_the_configured_threads(make_engine, threads):
    engine = make_engine(device="cpu", cpu_threads=threads)
    assert engine.cpu_threads == threads
    out = engine.generate([[1, 2, 3]], [None], SamplingParams(max_tokens=2, temperature=0))[0]
    assert len(out.token_ids) == 2


def test_threads_are_automatic_on_the_cpu_only_and_validated():
    auto = EngineConfig()
    assert auto.cpu_threads_for("cpu") == max(1, usable_cores() - 1)
    assert auto.cpu_threads_for("cuda") is None  # torch keeps its own count beside a GPU
    assert EngineConfig(cpu_threads=5).cpu_threads_for("cuda") == 5
    with pytest.raises(ValueError, match="cpu_threads"):
        EngineConfig(cpu_threads=0)
