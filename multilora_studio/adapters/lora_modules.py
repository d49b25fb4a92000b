"""Adapters named on a command line or in a deployment's arguments: ``name=path`` pairs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def parse_lora_modules(items: Sequence[str]) -> dict[str, Path]:
    """``name=path`` pairs (vLLM's --lora-modules) into a dict; a bare path is named by its folder."""
    modules: dict[str, Path] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep:
            name, path = Path(item).name, item
        if not name or not path:
            raise ValueError(f"--lora-modules entries look like name=path, got {item!r}")
        modules[name] = Path(path).expanduser()
    return modules
