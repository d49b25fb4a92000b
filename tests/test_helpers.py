"""The test helpers themselves: a failure in a helper thread fails the test; waits time out."""

from __future__ import annotations

import threading

import pytest

from tests.threads import CheckedThread, Failures, run_threads
from tests.waiting import wait_until


def fail_inside() -> None:
    raise AssertionError("failed in a helper thread")


def test_a_failed_assert_in_a_thread_is_raised_by_join():
    thread = CheckedThread(fail_inside)
    thread.start()
    with pytest.raises(AssertionError, match="failed in a helper thread"):
        thread.join()


def test_run_threads_joins_all_and_raises_the_first_failure():
    ran: list[int] = []
    with pytest.raises(AssertionError, match="helper thread"):
        run_threads(CheckedThread(ran.append, 1), CheckedThread(fail_inside), CheckedThread(ran.append, 3))
    assert sorted(ran) == [1, 3]


def test_a_thread_still_running_fails_its_join():
    release = threading.Event()
    thread = CheckedThread(release.wait)
    thread.start()
    with pytest.raises(AssertionError, match="still running"):
        thread.join(timeout=0.01)
    release.set()
    thread.join()


def test_failures_of_guarded_calls_are_raised_in_the_test_thread():
    failures = Failures()
    guarded = failures.guard(fail_inside)
    raised: list[bool] = []

    def call() -> None:
        try:
            guarded()
        except AssertionError:
            raised.append(True)  # the guarded call still raises where it runs

    run_threads(CheckedThread(call))
    assert raised == [True]
    with pytest.raises(AssertionError, match="helper thread"):
        failures.raise_first()
    assert failures.guard(lambda: 5)() == 5


def test_wait_until_returns_once_true_and_names_what_it_waited_for():
    calls: list[int] = []
    wait_until(lambda: calls.append(1) or len(calls) >= 3)
    assert len(calls) == 3
    with pytest.raises(AssertionError, match=r"timed out after 0\.01 s waiting for the moon"):
        wait_until(lambda: False, timeout=0.01, what="the moon")
