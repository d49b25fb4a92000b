"""A library of many small PEFT adapters for the embedded model, registered through the real
``Registry`` (for ``benchmarks.library_scale``).

Six distinct weight files (ranks 1-2 on one or two attention projections, 70-280 KB) are
written once; each adapter's source folder holds a copy of its config and a hard link to one
of them, and ``Registry.import_folder`` validates and copies it into the library as it would
any folder. Every tenth adapter has an alias, every tenth was validated against another
revision of the base (another digest: listed, not served), every hundredth is retired and
every two-hundredth pinned.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from multilora_studio.adapters.base_model import BaseModelRef
from multilora_studio.adapters.peft_adapter import WEIGHTS_FILE
from multilora_studio.adapters.registry import Registry
from multilora_studio.bench.random_adapters import write_random_adapter
from multilora_studio.engine.model.model_spec import ModelSpec

TEMPLATES = (  # (rank, targets)
    (1, ("q_proj",)),
    (1, ("v_proj",)),
    (2, ("q_proj",)),
    (1, ("o_proj",)),
    (1, ("q_proj", "v_proj")),
    (2, ("q_proj", "v_proj")),
)
CONFIG_FILE = "adapter_config.json"


def adapter_name(index: int) -> str:
    return f"team{index % 40:02d}/task-{index:05d}"


def alias_of(index: int) -> str | None:
    return f"t{index:05d}" if index % 10 == 3 else None


def other_revision(base: BaseModelRef) -> BaseModelRef:
    """The same shapes under another name and digest: a retrained revision of the base."""
    digest = hashlib.sha256(f"retrained {base.digest}".encode()).hexdigest()
    return dataclasses.replace(base, name=f"{base.name}-retrained", digest=digest)


def build_library(registry: Registry, base: BaseModelRef, spec: ModelSpec, count: int, work: Path) -> int:
    """Register adapters until the library holds ``count`` of this farm; returns how many it added."""
    have = {record.name for record in registry.list_adapters()}
    missing = [index for index in range(count) if adapter_name(index) not in have]
    if not missing:
        return 0
    templates = work / "templates"
    for number, (rank, targets) in enumerate(TEMPLATES):
        if not (templates / str(number) / WEIGHTS_FILE).is_file():
            write_random_adapter(spec, templates / str(number), rank, targets, seed=number)
    retrained = other_revision(base)

    def register(index: int) -> None:
        template = templates / str(index % len(TEMPLATES))
        source = work / "sources" / f"a{index:05d}"
        shutil.rmtree(source, ignore_errors=True)
        source.mkdir(parents=True)
        shutil.copy(template / CONFIG_FILE, source / CONFIG_FILE)
        os.link(template / WEIGHTS_FILE, source / WEIGHTS_FILE)
        alias = alias_of(index)
        registry.import_folder(
            source,
            retrained if index % 10 == 7 else base,
            name=adapter_name(index),
            aliases=(alias,) if alias else (),
        )
        shutil.rmtree(source)
        if index % 100 == 11:
            registry.retire(adapter_name(index), "benchmark")
        if index % 200 == 5:
            registry.set_pinned(adapter_name(index))

    with ThreadPoolExecutor(8) as pool:  # the copies' fsyncs wait on the disk, not the CPU
        list(pool.map(register, missing))
    return len(missing)
