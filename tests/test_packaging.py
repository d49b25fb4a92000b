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
