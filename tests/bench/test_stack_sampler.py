"""The benchmark's stack sampler sees what a named thread is running, in the window asked for,
and reports the gaps in which it could not sample."""

from __future__ import annotations

import math
import threading
import time

import pytest

from multilora_studio.bench.stack_sampler import StackSampler
from tests.threads import CheckedThread
from tests.waiting import wait_until

WAIT_S = 10.0


def busy_until_seen(sampler: StackSampler, since: float, hits: int) -> None:
    """Run Python until the sampler has seen this thread on one stack ``hits`` times."""
    name = threading.current_thread().name
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for _ in range(100):
            sum(range(1000))
        top = sampler.during(since, math.inf).get(name)
        if top and top[0][1] >= hits:
            return


def test_sampler_attributes_stacks_to_threads_and_windows():
    sampler = StackSampler(interval_s=0.002)
    sampler.start()
    start = time.perf_counter()
    worker = CheckedThread(busy_until_seen, sampler, start, 5, name="busy-worker")
    worker.start()
    worker.join()
    end = time.perf_counter()
    wait_until(lambda: sampler.ticks[-1] > end + 0.05, what="samples after the worker ended")
    sampler.stop()
    seen = sampler.during(start, end)
    assert "busy-worker" in seen
    top_stack, hits = seen["busy-worker"][0]
    assert "busy_until" in top_stack and hits >= 5
    assert "busy-worker" not in sampler.during(end + 0.01, end + 0.05)  # it had ended
    assert sampler.ident not in {t.ident for t in threading.enumerate()}
    assert all(seconds > 0.015 for _, seconds in sampler.stalls())


def test_stalls_are_the_gaps_between_ticks_longer_than_asked():
    sampler = StackSampler()  # not started: its ticks are set by hand
    sampler.ticks = [1.000, 1.002, 1.030, 1.032, 1.034, 1.100]
    stalls = sampler.stalls()
    assert [start for start, _ in stalls] == [1.002, 1.034]
    assert [seconds for _, seconds in stalls] == pytest.approx([0.028, 0.066])
    assert [start for start, _ in sampler.stalls(longer_than_s=0.03)] == [1.034]
    assert sampler.stalls(longer_than_s=0.1) == []


class HeldOnce(list):
    """A samples list whose first append waits until the test releases it: the sampler stalls."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = threading.Event()
        self.release = threading.Event()

    def append(self, item) -> None:
        if not self.holding.is_set():
            self.holding.set()
            self.release.wait(WAIT_S)
        super().append(item)


def test_a_sampler_kept_from_running_reports_the_stall():
    sampler = StackSampler(interval_s=0.002)
    sampler.samples = held = HeldOnce()
    sampler.start()
    assert held.holding.wait(WAIT_S)
    held_at = sampler.ticks[-1]  # the tick whose samples wait
    time.sleep(0.05)  # at least 50 ms without a tick
    held.release.set()
    wait_until(lambda: sampler.ticks[-1] > held_at, what="the next tick")
    sampler.stop()
    assert [(start, seconds >= 0.05) for start, seconds in sampler.stalls() if start == held_at] == [
        (held_at, True)
    ]
