"""Demo adapters trained on the embedded model, shipped in ``resources/demo_adapters``.

``register_demo_adapters`` adds them to the library on first start; an adapter the user
removes later is not added again.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from multilora_studio.adapters.adapter_config import AdapterError
from multilora_studio.adapters.base_model import BaseModelRef
from multilora_studio.adapters.registry import LibraryError, Registry
from multilora_studio.adapters.registry_schema import AdapterRecord

log = logging.getLogger(__name__)

INDEX_FILE = "index.json"
OFFERED_FILE = "demo_adapters_offered.json"  # in the library's root: names registered once


@dataclass(frozen=True)
class DemoAdapter:
    name: str
    folder: Path
    summary: str


def demo_adapters_root() -> Path:
    """The folder that holds the demo adapters and their index (inside the installed package)."""
    from multilora_studio.resources import resource_path

    return resource_path("demo_adapters")


def read_index(root: Path | None = None) -> dict:
    """The demo adapters' index: base model name and digest, and one entry per adapter."""
    root = root or demo_adapters_root()
    return json.loads((root / INDEX_FILE).read_text())


def demo_adapters(root: Path | None = None) -> list[DemoAdapter]:
    root = root or demo_adapters_root()
    return [
        DemoAdapter(entry["name"], root / entry["folder"], entry["summary"])
        for entry in read_index(root)["adapters"]
    ]


def demo_adapter_dirs(root: Path | None = None) -> dict[str, Path]:
    """Each demo adapter's name and PEFT folder."""
    return {adapter.name: adapter.folder for adapter in demo_adapters(root)}


def register_demo_adapters(
    registry: Registry, base: BaseModelRef, root: Path | None = None
) -> list[AdapterRecord]:
    """Import the demo adapters not offered before into the library; returns those added.

    Only for the base model they were trained on (its name or its weights digest). A demo
    name already taken by another adapter is left alone. Safe to call at every start.
    """
    root = root or demo_adapters_root()
    index = read_index(root)
    if base.name != index["base_model"] and base.digest != index["base_digest"]:
        log.info("demo adapters are for %s, not %s: not registered", index["base_model"], base.name)
        return []
    marker = registry.root / OFFERED_FILE
    offered = set(json.loads(marker.read_text())) if marker.is_file() else set()
    added = []
    for adapter in demo_adapters(root):
        if adapter.name in offered:
            continue
        if registry.find(adapter.name) is None:
            try:
                added.append(
                    registry.import_folder(adapter.folder, base, name=adapter.name, notes=adapter.summary)
                )
            except AdapterError as error:
                log.warning("demo adapter %s not registered: %s", adapter.name, error)
                continue
            except LibraryError as error:  # the name was taken meanwhile
                log.info("demo adapter %s not registered: %s", adapter.name, error)
        offered.add(adapter.name)
    staging = marker.with_name(f".{marker.name}.{os.getpid()}")
    staging.write_text(json.dumps(sorted(offered)))
    os.replace(staging, marker)
    return added
