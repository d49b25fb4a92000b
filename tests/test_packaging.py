"""The wheel holds every package of the source tree (pyproject lists them one by one)."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_in_pyproject():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    folders = {
        "multilora_studio." + ".".join(init.parent.relative_to(ROOT / "multilora_studio").parts)
        for init in (ROOT / "multilora_studio").rglob("__init__.py")
        if not init.parent.is_symlink() and init.parent != ROOT / "multilora_studio"
    }
    mapped = set(setuptools["package-dir"]) - {"multilora_studio"}  # folders outside the package
    assert folders - listed == set(), "add these packages to [tool.setuptools] packages"
    assert mapped <= listed


def test_every_resource_file_is_package_data():
    """A file under resources/ that no package-data pattern names would be missing from the wheel."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = setuptools["package-data"]["multilora_studio.resources"]
    resources = ROOT / setuptools["package-dir"]["multilora_studio.resources"]
    matched = {path for pattern in patterns for path in resources.glob(pattern)}  # as setuptools globs
    data = {path for path in resources.rglob("*") if path.is_file() and path.suffix not in (".py", ".pyc")}
    assert data and sorted(map(str, data - matched)) == [], "add them to [tool.setuptools.package-data]"


def test_the_checkouts_demo_prompt_set_is_the_packaged_one():
    from multilora_studio.demo import demo_prompt_set

    packaged = demo_prompt_set()
    assert packaged.is_file() and packaged.is_relative_to(ROOT / "resources")
    assert (ROOT / "docs" / "examples" / "demo-prompts.jsonl").resolve() == packaged.resolve()
