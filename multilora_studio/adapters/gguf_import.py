"""Import a llama.cpp GGUF LoRA adapter into the library: read into a PEFT folder, then
imported (validated against the base) as any folder is, the GGUF file recorded as its source."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

from multilora_studio.adapters.base_model import BaseModelRef
from multilora_studio.adapters.gguf_adapter import read_gguf_adapter
from multilora_studio.adapters.registry import DEFAULT_MAX_RANK, Registry
from multilora_studio.adapters.registry_schema import AdapterRecord


def import_gguf_adapter(
    registry: Registry,
    path: Path,
    base: BaseModelRef,
    *,
    name: str | None = None,
    aliases: Sequence[str] = (),
    notes: str = "",
    max_rank: int = DEFAULT_MAX_RANK,
) -> AdapterRecord:
    """Add the GGUF LoRA adapter at ``path`` to the library as ``name`` (default: the file's stem)."""
    path = Path(path).expanduser().resolve()
    name = name or path.stem
    registry.check_names(name, aliases)
    with tempfile.TemporaryDirectory(prefix=".gguf-import-", dir=registry.root) as scratch:
        read = read_gguf_adapter(path, base, Path(scratch) / name.replace("/", "_"))
        converted = (
            f"converted from GGUF ({read.architecture}, {read.tensors} LoRA pairs, alpha {read.alpha:g})"
        )
        return registry.import_folder(
            read.folder,
            base,
            name=name,
            aliases=aliases,
            notes=f"{notes}; {converted}" if notes else converted,
            max_rank=max_rank,
            source_file=path,
        )
