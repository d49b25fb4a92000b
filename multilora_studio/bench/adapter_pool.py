"""Many random adapters on little disk: a few distinct weight files, the rest linked to them.

Each adapter is its own PEFT folder (own ``adapter_config.json``), so the engine loads,
validates, packs and uploads every one separately; only the bytes on disk are shared.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from pathlib import Path

import torch

from multilora_studio.bench.random_adapters import write_random_adapter
from multilora_studio.engine.model.model_spec import PROJECTIONS, ModelSpec

log = logging.getLogger(__name__)

WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"


def parse_targets(text: str) -> tuple[str, ...]:
    """``all`` or comma-separated projection names (q_proj,v_proj,...)."""
    if text.strip() == "all":
        return PROJECTIONS
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in PROJECTIONS]
    if not names or unknown:
        raise ValueError(f"--targets is 'all' or a list of {', '.join(PROJECTIONS)}; got {text!r}")
    return names


def link_file(source: Path, target: Path) -> str:
    """Hard-link ``target`` to ``source`` (symlink, then copy, where that fails); returns how."""
    with contextlib.suppress(FileNotFoundError):
        target.unlink()
    try:
        os.link(source, target)
        return "hardlink"
    except OSError:
        pass
    try:
        target.symlink_to(source.resolve())
        return "symlink"
    except OSError:
        shutil.copyfile(source, target)
        return "copy"


def adapter_name(index: int) -> str:
    return f"bench-{index}"


def make_adapter_pool(
    spec: ModelSpec,
    root: Path,
    count: int,
    distinct: int,
    rank: int,
    targets: tuple[str, ...] = PROJECTIONS,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> dict[str, Path]:
    """``count`` adapter folders under ``root``: the first ``distinct`` written, the rest linked.

    Adapter ``i`` shares the weights of adapter ``i % distinct``. Returns name -> folder.
    """
    if count < 1 or distinct < 1:
        raise ValueError(f"need at least one adapter and one weight file, got {count} and {distinct}")
    distinct = min(distinct, count)
    root.mkdir(parents=True, exist_ok=True)
    folders: dict[str, Path] = {}
    how: dict[str, int] = {}
    for index in range(count):
        folder = root / adapter_name(index)
        if index < distinct:
            write_random_adapter(spec, folder, rank, targets, seed=seed + index, dtype=dtype)
        else:
            source = folders[adapter_name(index % distinct)]
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / CONFIG, folder / CONFIG)
            kind = link_file(source / WEIGHTS, folder / WEIGHTS)
            how[kind] = how.get(kind, 0) + 1
        folders[adapter_name(index)] = folder
    log.info("%d adapters under %s: %d weight files written, links %s", count, root, distinct, how or "-")
    return folders
