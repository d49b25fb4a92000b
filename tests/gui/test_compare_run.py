"""A compare run ends however its bases fail: a column closed on the run's own launch thread (its
base could not be leased: the pool stopped for a restart, or the run was stopped before it
launched) still lets the run finish once its bookkeeping is done, instead of waiting on itself."""

from __future__ import annotations

import pytest

from multilora_studio.deploy import BasePool
from multilora_studio.engine import EngineConfig, SamplingParams
from multilora_studio.gui.compare_run import ColumnRequest, CompareRun

FINISH_MS = 30_000  # the run's end comes at once; this only bounds a hang


@pytest.fixture
def stopped_pool(tiny_model_dir) -> BasePool:
    """A pool whose base cannot be leased any more: it was shut down, as a restart does."""
    config = EngineConfig(model=str(tiny_model_dir), device="cpu", dtype="float32", max_model_len=64)
    pool = BasePool([config])
    pool.shutdown()
    return pool


def finishes(qtbot, run: CompareRun) -> None:
    """Start ``run`` and wait for its ``finished`` (delivered on this thread's event loop)."""
    with qtbot.waitSignal(run.finished, timeout=FINISH_MS):
        run.start()


def test_a_run_whose_base_cannot_be_leased_finishes_with_its_columns_failed(qtbot, stopped_pool):
    base = stopped_pool.names[0]
    requests = [ColumnRequest(name, "Hello", SamplingParams(max_tokens=2), base) for name in (base, base)]
    run = CompareRun(stopped_pool, requests, side_work=lambda: "identified")
    finishes(qtbot, run)
    for column in run.columns:
        assert column.output is not None and column.output.finish_reason == "error", column
        assert column.output.error is not None and "stopping" in column.output.error
    assert run.side_result == "identified"  # finished came after the side work, not before


def test_a_run_stopped_before_it_launched_finishes_with_its_columns_aborted(qtbot, stopped_pool):
    base = stopped_pool.names[0]
    run = CompareRun(stopped_pool, [ColumnRequest(base, "Hello", SamplingParams(max_tokens=2), base)])
    run.stop()
    finishes(qtbot, run)
    output = run.columns[0].output
    assert output is not None and output.finish_reason == "abort"
