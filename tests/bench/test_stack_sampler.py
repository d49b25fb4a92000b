"""The benchmark's stack sampler sees what a named thread is running, in the window asked for."""

from __future__ import annotations

import threading
import time

from multilora_studio.bench.stack_sampler import StackSampler


def busy_until(deadline: float) -> None:
    while time.perf_counter() < deadline:
        sum(range(1000))


def test_sampler_attributes_stacks_to_threads_and_windows():
    sampler = StackSampler(interval_s=0.002)
    sampler.start()
    start = time.perf_counter()
    worker = threading.Thread(target=busy_until, args=(start + 0.15,), name="busy-worker")
    worker.start()
    worker.join()
    end = time.perf_counter()
    time.sleep(0.05)
    sampler.stop()
    seen = sampler.during(start, end)
    assert "busy-worker" in seen
    top_stack, hits = seen["busy-worker"][0]
    assert "busy_until" in top_stack and hits >= 5
    assert "busy-worker" not in sampler.during(end + 0.01, end + 0.05)  # it had ended
    assert sampler.ident not in {t.ident for t in threading.enumerate()}
    assert all(seconds > 0.015 for _, seconds in sampler.stalls())
