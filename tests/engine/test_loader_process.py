"""Adapter loads in a child process: same weights, same tokens, errors and a dead child handled."""

from __future__ import annotations

import os
import signal
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from multilora_studio.adapters.peft_adapter import AdapterError, load_peft_adapter
from multilora_studio.engine import SamplingParams
from multilora_studio.engine.model.model_spec import load_spec
from multilora_studio.engine.residency.adapter_packing import max_packed_bytes, pack_adapter
from multilora_studio.engine.residency.loader_process import LoaderProcess
from tests.engine.test_engine_behaviour import broken_copy

GREEDY = dict(temperature=0, ignore_eos=True)


def test_process_loads_give_the_thread_loads_tokens_through_evictions(make_engine, tiny_adapters):
    names = sorted(tiny_adapters)
    prompts = [f"Prompt number {i} about the sea" for i in range(len(names) + 1)]
    adapters = [*names, None]
    params = SamplingParams(max_tokens=12, **GREEDY)
    expected = [o.token_ids for o in make_engine().generate(prompts, adapters, params)]
    # Two GPU slots and two host slots: adapters are evicted and read again by the child.
    engine = make_engine(adapters=[], adapter_loader="process", max_loras=2, max_cpu_loras=2)
    for name in names:
        engine.add_adapter(name, tiny_adapters[name], preload=False)
    for _ in range(2):
        got = engine.generate(prompts, adapters, params)
        assert [o.finish_reason for o in got] == ["length"] * len(got)
        assert [o.token_ids for o in got] == expected
    assert engine.metrics(fresh=True).cpu_misses >= len(names)


def test_a_bad_adapter_fails_in_the_child_and_the_next_loads_work(make_engine, tiny_adapters, tmp_path):
    def nan(folder):
        tensors = load_file(str(folder / "adapter_model.safetensors"))
        first = sorted(tensors)[0]
        tensors[first][0, 0] = float("nan")
        save_file(tensors, str(folder / "adapter_model.safetensors"))

    engine = make_engine(adapters=[], adapter_loader="process")
    broken = broken_copy(tiny_adapters["tiny-r8-all"], tmp_path / "nan", nan)
    engine.add_adapter("nan-later", broken, preload=False)
    engine.add_adapter("good", tiny_adapters["tiny-r4-qv"], preload=False)
    params = SamplingParams(max_tokens=6, **GREEDY)
    bad, good = engine.generate(["Hello", "Hello"], ["nan-later", "good"], params)
    assert bad.finish_reason == "error" and "NaN or Inf" in bad.error
    assert good.finish_reason == "length" and len(good.token_ids) == 6


@pytest.mark.skipif(sys.platform == "win32", reason="kills the child with SIGKILL")
def test_loader_packs_like_the_thread_and_survives_a_killed_child(tiny_model_dir, tiny_adapters):
    spec = load_spec(tiny_model_dir)
    loader = LoaderProcess(spec, 32, torch.float32, max_packed_bytes(spec, 32, torch.float32))
    try:
        for name in ("tiny-r8-all", "tiny-r16-mlp"):
            folder = tiny_adapters[name]
            got = loader.load(name, folder, arena=None, keep=0)
            layers, shape_of = spec.num_layers, spec.projection_shape
            host = load_peft_adapter(name, folder, layers, shape_of, 32, spec.vocab)
            want = pack_adapter(host, spec, torch.float32, pin=False)
            assert got.rank == want.rank and set(got.a) == set(want.a)
            for group in want.a:
                assert torch.equal(got.a[group], want.a[group]) and torch.equal(got.b[group], want.b[group])
        for pid in list(loader._pool._processes):  # the child dies between two loads
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(AdapterError, match="loader process died"):
            loader.load("tiny-r4-qv", tiny_adapters["tiny-r4-qv"], arena=None, keep=0)
        again = loader.load("tiny-r4-qv", tiny_adapters["tiny-r4-qv"], arena=None, keep=0)
        assert again.rank == 4
    finally:
        loader.close()


def test_close_ends_children_still_starting_instead_of_waiting_for_them(tiny_model_dir):
    """An engine stopped right after its start (Ctrl+C on ``serve``, a restart from Settings)
    does not wait for its loader children to import torch: close ends each one by SIGTERM
    (a pool's own shutdown let every child start first, then exit with 0)."""
    spec = load_spec(tiny_model_dir)
    loader = LoaderProcess(spec, 32, torch.float32, max_packed_bytes(spec, 32, torch.float32), workers=3)
    children = list(loader._context.children)
    loader.close()
    assert [child.exitcode for child in children] == [-signal.SIGTERM] * 3


def test_several_children_load_at_once_each_into_its_own_staging_buffer(tiny_model_dir, tiny_adapters):
    from concurrent.futures import ThreadPoolExecutor

    spec = load_spec(tiny_model_dir)
    names = sorted(tiny_adapters)
    loader = LoaderProcess(spec, 32, torch.float32, max_packed_bytes(spec, 32, torch.float32), workers=3)
    try:
        with ThreadPoolExecutor(3) as threads:  # as the host tier's three loader threads would
            got = list(threads.map(lambda n: loader.load(n, tiny_adapters[n], arena=None, keep=0), names * 2))
        layers, shape_of = spec.num_layers, spec.projection_shape
        for name, packed in zip(names * 2, got, strict=True):
            host = load_peft_adapter(name, tiny_adapters[name], layers, shape_of, 32, spec.vocab)
            want = pack_adapter(host, spec, torch.float32, pin=False)
            assert packed.name == name and packed.rank == want.rank and set(packed.a) == set(want.a)
            for group in want.a:
                assert torch.equal(packed.a[group], want.a[group]) and torch.equal(
                    packed.b[group], want.b[group]
                )
        assert sorted(loader._free.get() for _ in range(3)) == [0, 1, 2]  # every buffer given back
    finally:
        loader.close()


def test_process_loader_with_several_workers_serves_the_same_tokens(make_engine, tiny_adapters):
    names = sorted(tiny_adapters)
    prompts = [f"Tell me about ship {i}" for i in range(len(names))]
    params = SamplingParams(max_tokens=10, **GREEDY)
    expected = [o.token_ids for o in make_engine().generate(prompts, names, params)]
    engine = make_engine(
        adapters=[], adapter_loader="process", adapter_load_workers=2, max_loras=2, max_cpu_loras=2
    )
    assert engine.adapter_loader == "process"
    for name in names:
        engine.add_adapter(name, tiny_adapters[name], preload=False)
    assert [o.token_ids for o in engine.generate(prompts, names, params)] == expected
    snapshot = engine.metrics(fresh=True)
    assert (snapshot.adapter_loader, snapshot.adapter_load_workers) == ("process", 2)
    assert snapshot.pinned_blocks_exhausted == 0  # no pinned arena on the CPU


SCRIPT = """
import sys
from pathlib import Path
import torch
from multilora_studio.engine.residency.loader_process import LoaderProcess
from multilora_studio.engine.residency.adapter_packing import max_packed_bytes
from multilora_studio.engine.model.model_spec import load_spec

with open(sys.argv[1], "a") as runs:  # one line each time this script's body runs
    runs.write("ran\\n")
spec = load_spec(Path(sys.argv[2]))
loader = LoaderProcess(spec, 32, torch.float32, max_packed_bytes(spec, 32, torch.float32), workers=2)
print("rank", loader.load("a", Path(sys.argv[3]), arena=None, keep=0).rank)
loader.close()
"""


@pytest.mark.parametrize("how", ["script without a main guard", "stdin"])
def test_children_never_rerun_the_parents_main_script(how, tmp_path, tiny_model_dir, tiny_adapters):
    import subprocess

    runs = tmp_path / "runs.txt"
    args = [str(runs), str(tiny_model_dir), str(tiny_adapters["tiny-r8-all"])]
    if how == "stdin":
        command, stdin = [sys.executable, "-", *args], SCRIPT
    else:
        script = tmp_path / "serve_adapters.py"
        script.write_text(SCRIPT)
        command, stdin = [sys.executable, str(script), *args], None
    done = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "rank 8" in done.stdout
    assert runs.read_text().splitlines() == ["ran"]  # the children did not run it again


MIB = 1 << 20


@pytest.mark.parametrize(
    ("free_mib", "buffer_mib", "wanted", "expected"),
    [
        # 1000 MiB free: 64 MiB (the cap on what is left to others) stays free, 936 MiB usable
        (1000, 400, 5, 2),
        (1000, 100, 20, 9),
        (1000, 100, 3, 3),  # no more than wanted
        (1000, 937, 4, 0),
        (1000, 936, 4, 1),
        # 80 MiB free: an eighth (10 MiB) stays free, 70 MiB usable
        (80, 35, 4, 2),
        (80, 36, 4, 1),
        (80, 81, 4, 0),
    ],
)
def test_staging_buffers_are_limited_by_free_shared_memory(
    monkeypatch, free_mib, buffer_mib, wanted, expected
):
    import shutil
    from collections import namedtuple

    from multilora_studio.engine.residency import loader_process

    usage = namedtuple("usage", "total used free")
    asked: list[str] = []

    def disk_usage(path):
        asked.append(str(path))
        return usage(4096 * MIB, 4096 * MIB - free_mib * MIB, free_mib * MIB)

    monkeypatch.setattr(shutil, "disk_usage", disk_usage)
    monkeypatch.setattr(loader_process.Path, "is_dir", lambda self: True)
    assert loader_process.staging_buffers_that_fit(buffer_mib * MIB, wanted) == expected
    assert asked == ["/dev/shm"]


def test_without_dev_shm_every_staging_buffer_is_made(monkeypatch):
    from multilora_studio.engine.residency import loader_process

    monkeypatch.setattr(loader_process.Path, "is_dir", lambda self: False)
    assert loader_process.staging_buffers_that_fit(1 << 40, 3) == 3  # nothing to measure: as many as wanted
