"""Loader threads that end when idle: concurrency cap, errors, shutdown, the one-off call."""

from __future__ import annotations

import threading

import pytest

from multilora_studio.adapters.short_lived_workers import ShortLivedWorkers, call_on_short_lived_thread
from tests.threads import Failures
from tests.waiting import wait_until

WAIT_S = 10.0


def live_threads(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


def test_at_most_max_workers_run_at_once_and_threads_end_when_idle():
    workers = ShortLivedWorkers(2, "cap-test")
    gate = threading.Event()
    lock = threading.Lock()
    state = {"now": 0, "peak": 0, "done": 0}
    failures = Failures()  # the workers log a call's exception; the test must see it

    def work() -> None:
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
        assert gate.wait(WAIT_S)
        with lock:
            state["now"] -= 1
            state["done"] += 1

    for _ in range(6):
        workers.submit(failures.guard(work))
    wait_until(lambda: state["now"] == 2, what="two calls running")
    assert len(live_threads("cap-test")) == 2
    gate.set()
    wait_until(lambda: failures.errors or state["done"] == 6, what="six calls done")
    failures.raise_first()
    wait_until(lambda: workers.running() == 0)
    assert state["peak"] == 2
    wait_until(lambda: not live_threads("cap-test"))  # the threads themselves are gone
    workers.submit(lambda: state.__setitem__("done", 7))  # and new ones start on demand
    wait_until(lambda: state["done"] == 7)
    workers.shutdown()


def test_a_failing_call_does_not_stop_the_others(caplog):
    workers = ShortLivedWorkers(1, "fail-test")
    ran: list[int] = []

    def boom() -> None:
        raise RuntimeError("broken adapter")

    workers.submit(boom)
    workers.submit(ran.append, 1)
    wait_until(lambda: ran == [1])
    workers.shutdown()
    assert "fail-test" in caplog.text and "broken adapter" in caplog.text


def test_shutdown_drops_queued_calls_and_waits_for_running_ones():
    workers = ShortLivedWorkers(1, "stop-test")
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []
    failures = Failures()

    def first() -> None:
        started.set()
        assert release.wait(WAIT_S)
        ran.append("first")

    workers.submit(failures.guard(first))
    workers.submit(ran.append, "queued")
    assert started.wait(WAIT_S)
    threading.Timer(0.05, release.set).start()
    workers.shutdown()
    failures.raise_first()
    assert ran == ["first"]
    with pytest.raises(RuntimeError, match="shut down"):
        workers.submit(ran.append, "late")


def test_max_workers_must_be_positive():
    with pytest.raises(ValueError, match="max_workers"):
        ShortLivedWorkers(0, "x")


def test_call_on_short_lived_thread_returns_or_raises_from_another_thread():
    caller = threading.get_ident()
    seen: list[threading.Thread] = []

    def which() -> int:
        seen.append(threading.current_thread())
        return threading.get_ident()

    assert call_on_short_lived_thread(which) != caller
    assert not seen[0].is_alive()
    with pytest.raises(ValueError, match="bad rank"):
        call_on_short_lived_thread(lambda: (_ for _ in ()).throw(ValueError("bad rank")))
