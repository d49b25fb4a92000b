"""Loader threads cap their own torch CPU threads and leave everyone else's alone."""

from __future__ import annotations

import threading

import pytest
import torch

from multilora_studio.adapters.short_lived_workers import call_on_short_lived_thread
from multilora_studio.engine.host_threads import LOADER_TORCH_THREADS, loader_threads
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
    before_new = threads_of_a_new_thread()
    if before_new == LOADER_TORCH_THREADS["cpu"]:
        pytest.skip("one CPU thread: the cap changes nothing to observe")
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
    before = threads_of_a_new_thread()
    engine = make_engine(device="cpu")  # adds every fixture adapter (read and packed on loader threads)
    assert len(engine.list_adapters()) == len(tiny_adapters)
    assert threads_of_a_new_thread() == before
