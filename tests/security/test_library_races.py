"""Library writes racing in real processes: two archives of one adapter at once, restores,
imports and removals, while other processes open the library (which sweeps it), in a loop for
a few seconds; afterwards nothing is lost and nothing is left over."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from multilora_studio.adapters.registry import Registry
from multilora_studio.cli.shared import describe_base
from multilora_studio.util import sha256_file
from tests.security.library_checks import assert_consistent

REPO_ROOT = Path(__file__).resolve().parents[2]
RACE_S = 8.0  # each racer's loop; they start together, so this is the race's length
GUARD_S = 180.0  # a racer that never ends fails the test instead of hanging it
MIN_ROUNDS = 5  # each kind of operation, across the racers: fewer and the race did not happen


def digests(folder: Path) -> dict[str, str]:
    return {path.name: sha256_file(path) for path in sorted(folder.iterdir())}


def start(root: Path, gate: Path, role: str, name: str, *extra: str) -> subprocess.Popen:
    command = ["tests.security.library_racer", str(root), str(gate), role, str(RACE_S), name, *extra]
    racer = subprocess.Popen(
        [sys.executable, "-m", *command],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return racer


def run_together(racers: list[subprocess.Popen], gate: Path) -> None:
    """Open ``gate`` once every racer is ready (its imports done), so their loops overlap."""
    for racer in racers:
        assert racer.stdout is not None
        line = racer.stdout.readline()
        assert line.strip() == "ready", racer.communicate()[1][-3000:]
    gate.touch()


def finish(racers: list[subprocess.Popen]) -> Counter:
    """Wait for every racer; each must end cleanly. The sum of their counts."""
    total: Counter = Counter()
    failures = []
    for racer in racers:
        try:
            out, err = racer.communicate(timeout=GUARD_S)
        except subprocess.TimeoutExpired:
            racer.kill()
            out, err = racer.communicate()
        if racer.returncode != 0:
            failures.append(f"{racer.args[5]}: exit {racer.returncode}\n{err[-3000:]}")
        else:
            total.update(json.loads(out.splitlines()[-1]))
    assert not failures, "\n".join(failures)
    return total


def test_archives_restores_and_opens_racing_lose_nothing(tmp_path, tiny_adapters, tiny_model_dir):
    root = tmp_path / "library"
    base = describe_base(str(tiny_model_dir))
    record = Registry(root).import_folder(tiny_adapters["tiny-r8-all"], base, name="contested")
    before = digests(record.path)
    fields = json.dumps(dataclasses.asdict(base))
    gate = tmp_path / "go"
    racers = [
        start(root, gate, "archive", "contested"),
        start(root, gate, "archive", "contested"),
        start(root, gate, "open", "contested"),
        start(root, gate, "open", "contested"),
        start(root, gate, "churn", "churn", fields, str(tiny_adapters["tiny-r4-qv"])),
    ]
    run_together(racers, gate)
    counts = finish(racers)
    print(dict(counts))
    for done in ("archived", "restored", "opened", "imported", "removed"):
        assert counts[done] >= MIN_ROUNDS, counts
    registry = assert_consistent(root)
    assert [r.name for r in registry.list_adapters()] == ["contested"]
    if registry.get("contested").state == "archived":
        registry.restore("contested")
    assert digests(registry.get("contested").path) == before
    assert_consistent(root)
