"""Demo adapters trained on the embedded model, shipped in ``resources/demo_adapters``.

``register_demo_adapters`` adds them to the library once; an adapter the user removes
later is not added again. ``offer_demo_adapters`` is what every start calls (the window's
engine start, ``serve``, ``compare``, ``adapters list``): skipped when
``$MULTILORA_STUDIO_NO_DEMO_ADAPTERS`` is set, a no-op once all were offered, and it
never raises.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from multilora_studio.adapters.adapter_config import AdapterError
from multilora_studio.adapters.base_model import BaseModelRef
from multilora_studio.adapters.private_files import write_private_text
from multilora_studio.adapters.registry import LibraryError, Registry
from multilora_studio.adapters.registry_schema import AdapterRecord

log = logging.getLogger(__name__)

INDEX_FILE = "index.json"
OFFERED_FILE = "demo_adapters_offered.json"  # in the library's root: names registered once
SKIP_ENV = "MULTILORA_STUDIO_NO_DEMO_ADAPTERS"  # set (not "", "0", "false", "no"): never offer them


@dataclass(frozen=True)
class DemoAdapter:
    name: str
    folder: Path
    summary: str


def demo_adapters_root() -> Path:
    """The folder that holds the demo adapters and their index (inside the installed package)."""
    from multilora_studio.resources import resource_path

    return resource_path("demo_adapters")


def demo_prompt_set() -> Path:
    """The demo adapters' example prompt set: one prompt per adapter with a check of its style
    (inside the installed package; ``eval --prompts demo`` and the Evaluate view offer it)."""
    from multilora_studio.resources import resource_path

    return resource_path("examples", "demo-prompts.jsonl")


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


def offered_names(registry: Registry) -> set[str]:
    """The demo adapter names this library was offered already (registered, or left alone)."""
    marker = registry.root / OFFERED_FILE
    return set(json.loads(marker.read_text())) if marker.is_file() else set()


def skip_requested() -> bool:
    """True when ``$MULTILORA_STUDIO_NO_DEMO_ADAPTERS`` asks not to offer the demo adapters."""
    return os.environ.get(SKIP_ENV, "").strip().lower() not in ("", "0", "false", "no")


def offer_demo_adapters(
    registry: Registry,
    base: BaseModelRef | Callable[[], BaseModelRef],
    root: Path | None = None,
) -> list[AdapterRecord]:
    """The start-up call: ``register_demo_adapters`` unless skipped; returns those added.

    ``base`` may be a function, called only when a demo adapter has not been offered yet
    (so a second start neither describes the base model nor writes anything). Any error
    is logged as a warning and the start goes on without the demo adapters.
    """
    if skip_requested():
        log.debug("demo adapters not offered: $%s is set", SKIP_ENV)
        return []
    if registry.read_only:
        log.debug("demo adapters not offered: the library can only be read")
        return []
    try:
        names = {adapter.name for adapter in demo_adapters(root)}
        if names <= offered_names(registry):
            return []
        added = register_demo_adapters(registry, base if isinstance(base, BaseModelRef) else base(), root)
    except Exception as error:  # a start never fails because of the demo adapters
        log.warning("the demo adapters were not added to the library: %s", error)
        return []
    if added:
        log.info("added the demo adapters to the library: %s", ", ".join(r.name for r in added))
    return added


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
    offered = offered_names(registry)
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
    write_private_text(marker, json.dumps(sorted(offered)))
    return added
