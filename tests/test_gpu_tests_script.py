"""scripts/gpu_tests.py: the GPU test set's files, less those a device cannot import, in parts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def listed(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_tests.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_parts_cover_the_runnable_files_once_and_name_what_is_left_out(tmp_path):
    folder = tmp_path / "tests" / "gpu"
    (folder / "deeper").mkdir(parents=True)
    runnable = [folder / f"test_{name}.py" for name in "abcd"] + [folder / "deeper" / "test_e.py"]
    for path in runnable:
        path.write_text("import torch\nfrom tests.engine import conftest\n")
    lacking = folder / "test_lacking.py"
    lacking.write_text("import torch\n\n\ndef test_x():\n    import no_such_package_here.sub\n")
    (folder / "helper.py").write_text("import no_such_package_here\n")  # not a test file
    parts = [listed("--shard", f"{i}/3", "tests/gpu", cwd=tmp_path) for i in (1, 2, 3)]
    assert [part.returncode for part in parts] == [0, 0, 0]
    files = [line for part in parts for line in part.stdout.split()]
    assert sorted(files) == sorted(str(path.relative_to(tmp_path)) for path in runnable)  # each once
    assert all("left out tests/gpu/test_lacking.py: needs no_such_package_here" in p.stderr for p in parts)
    assert lacking.name not in " ".join(files)
    whole = listed("tests/gpu", cwd=tmp_path)
    assert sorted(whole.stdout.split()) == sorted(files)  # one part by default: the whole set


def test_the_default_set_is_the_kernel_engine_and_server_tests():
    found = listed()
    assert found.returncode == 0, found.stderr
    files = set(found.stdout.split())
    assert {
        "tests/kernels/test_paged_attention.py",
        "tests/engine/test_step_graphs.py",
        "tests/server/test_openai_routes.py",
    } <= files
    assert not any(name.startswith(("tests/gui/", "tests/adapters/")) for name in files)


def test_a_part_without_files_or_a_bad_part_is_an_error(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_only.py").write_text("import os\n")
    empty = listed("--shard", "2/2", "tests", cwd=tmp_path)
    assert empty.returncode == 1 and "part 2/2 has no test files" in empty.stderr and not empty.stdout
    assert listed("--shard", "3/2", cwd=tmp_path).returncode == 2
    assert listed("--shard", "two", cwd=tmp_path).returncode == 2
