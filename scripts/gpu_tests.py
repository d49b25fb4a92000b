"""The test files of the GPU test set for one run on a GPU host, one per line.

    python3 scripts/gpu_tests.py [--shard I/N] [PATH ...]

PATHs (files or folders; default: ``GPU_SET``) give their ``test_*.py`` files, less those that
import a package this machine lacks (a GPU host gets only ``.device_pkg/``; each one
left out is named on stderr), split into N parts by turns: the I-th part is printed. N calls,
each within one run's time limit, run the whole set. Standard library only (it runs
with the GPU host's Python before anything is installed for the tests).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import sys
from pathlib import Path

GPU_SET = ("tests/kernels", "tests/engine", "tests/server")  # the tests that run on the GPU
OWN = {"tests", "multilora_studio", "__future__"}


def test_files(paths: list[str]) -> list[Path]:
    """Every ``test_*.py`` under ``paths``, sorted, each once."""
    found: set[Path] = set()
    for name in paths:
        path = Path(name)
        if path.is_dir():
            found.update(path.rglob("test_*.py"))
        elif path.is_file():
            found.add(path)
        else:
            raise SystemExit(f"gpu_tests: no such file or folder: {name}")
    return sorted(found)


def missing_imports(path: Path) -> list[str]:
    """Top-level packages that ``path`` imports anywhere (a test importing one inside a function
    fails as surely) and this machine lacks."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return sorted(name for name in names - OWN if importlib.util.find_spec(name) is None)


def shard(spec: str) -> tuple[int, int]:
    """``I/N`` -> (I, N), 1 <= I <= N."""
    try:
        index, count = (int(part) for part in spec.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard takes I/N, e.g. 2/3, got {spec!r}") from None
    if not 1 <= index <= count:
        raise argparse.ArgumentTypeError(f"--shard {spec}: I must be between 1 and N")
    return index, count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shard", type=shard, default=(1, 1), help="I/N: the I-th of N parts (default 1/1)")
    parser.add_argument("paths", nargs="*", default=list(GPU_SET), help="test files or folders")
    args = parser.parse_args(argv)
    runnable = []
    for path in test_files(args.paths):
        lacking = missing_imports(path)
        if lacking:
            print(f"gpu_tests: left out {path}: needs {', '.join(lacking)}", file=sys.stderr)
        else:
            runnable.append(path)
    index, count = args.shard
    part = runnable[index - 1 :: count]
    if not part:
        print(f"gpu_tests: part {index}/{count} has no test files", file=sys.stderr)
        return 1
    print("\n".join(str(path) for path in part))
    return 0


if __name__ == "__main__":
    sys.exit(main())
