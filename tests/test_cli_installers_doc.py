"""docs/installers.md names every make target and variable and every installer option and variable."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "installers.md"


def makefile_names() -> list[str]:
    text = (ROOT / "Makefile").read_text()
    (phony,) = re.findall(r"^\.PHONY:(.*)$", text, re.MULTILINE)
    return [f"make {target}" for target in phony.split()] + re.findall(r"^(\w+) \?=", text, re.MULTILINE)


def linux_names() -> list[str]:
    text = (ROOT / "installers" / "linux" / "install.sh").read_text()
    options = re.findall(r"^\s*(?:-h\|)?(--[a-z-]+)\)", text, re.MULTILINE)
    return options + sorted(set(re.findall(r"\$\{(\w+):-", text)))


def windows_names() -> list[str]:
    text = (ROOT / "installers" / "windows" / "install.ps1").read_text()
    (params,) = re.findall(r"^param\((.*?)^\)", text, re.MULTILINE | re.DOTALL)
    return [f"-{name}" for name in re.findall(r"\$(\w+)", params)]


def test_the_page_names_every_target_option_and_variable():
    text = PAGE.read_text()
    names = makefile_names() + linux_names() + windows_names()
    assert len(names) > 20  # the parsing above found them
    assert [name for name in names if f"`{name}" not in text] == []
