"""Several threads and several processes writing one library at once: nothing lost, nothing doubled."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from multilora_studio.adapters.registry import LibraryError, Registry
from tests.fixtures import TINY_ADAPTERS
from tests.threads import CheckedThread, run_threads

THREADS = 6
PROCESSES = 3
REPO_ROOT = Path(__file__).resolve().parents[2]


def assert_consistent(registry: Registry) -> None:
    """Every row has its folder and every folder its row; no staging or trash is left."""
    records = registry.list_adapters()
    assert sorted(p.name for p in registry.adapters_dir.iterdir()) == sorted(r.id for r in records)
    for record in records:
        weights = record.path / "adapter_model.safetensors"
        assert weights.stat().st_size == record.size_bytes


def test_threads_import_pin_and_read_at_once(registry, tiny_adapters, tiny_base):
    sources = [tiny_adapters[spec.name] for spec in TINY_ADAPTERS]
    start = threading.Barrier(THREADS + 1)
    results: dict[int, bool] = {}
    stop_reading = threading.Event()

    def writer(index: int) -> None:
        start.wait()
        source = sources[index % len(sources)]
        registry.import_folder(source, tiny_base, name=f"own-{index}", aliases=[f"alias-{index}"])
        try:
            registry.import_folder(source, tiny_base, name="contested")
            results[index] = True
        except LibraryError:
            results[index] = False
        registry.set_pinned(f"alias-{index}", index % 2 == 0)
        registry.touch(f"own-{index}")

    def reader() -> None:
        start.wait()
        while not stop_reading.is_set():
            for record in registry.list_adapters():
                assert record.path.is_dir()

    writers = [CheckedThread(writer, i, name=f"writer-{i}") for i in range(THREADS)]
    reading = CheckedThread(reader, name="reader")
    reading.start()
    try:
        run_threads(*writers)  # a writer's exception is raised here
    finally:
        stop_reading.set()
        reading.join()  # and so is a failed assert of the reader
    assert sum(results.values()) == 1
    names = sorted(r.name for r in registry.list_adapters())
    assert names == sorted(["contested", *(f"own-{i}" for i in range(THREADS))])
    for i in range(THREADS):
        record = registry.get(f"alias-{i}")
        assert record.pinned == (i % 2 == 0) and record.last_used is not None
    assert_consistent(registry)


def test_processes_share_one_library(tmp_path, tiny_adapters, tiny_base):
    root = tmp_path / "shared"
    Registry(root)
    base = json.dumps(dataclasses.asdict(tiny_base))
    sources = [str(tiny_adapters[spec.name]) for spec in TINY_ADAPTERS[:2]]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.adapters.registry_worker", str(root), base, f"p{i}", *sources],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(PROCESSES)
    ]
    reports = []
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    assert sum(report["won"] for report in reports) == 1
    registry = Registry(root)
    expected = {"contested"} | {f"p{i}-{j}" for i in range(PROCESSES) for j in range(len(sources))}
    assert {r.name for r in registry.list_adapters()} == expected
    assert all(r.pinned for r in registry.list_adapters() if r.name != "contested")
    assert_consistent(registry)
