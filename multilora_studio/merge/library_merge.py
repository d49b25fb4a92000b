"""Merges as the library sees them: adapters named by library name or folder, the base they
were validated against, and the result registered (a merged base, or a combined adapter).
The command line and the Library view both go through here."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from multilora_studio.adapters.base_model import BaseModelRef
from multilora_studio.adapters.peft_adapter import inspect_peft_adapter, weights_file
from multilora_studio.adapters.registry import MERGED_REVISION, Registry
from multilora_studio.adapters.registry_schema import AdapterRecord, BaseModelRecord
from multilora_studio.engine.model.model_source import describe_model
from multilora_studio.engine.model.model_spec import load_spec
from multilora_studio.merge.export import DTYPE_NAMES, MergedModel, MergeRequest, merge_and_export
from multilora_studio.merge.merged_weights import MergeError
from multilora_studio.merge.model_card import AdapterSource, BaseSource
from multilora_studio.merge.weighted_adapters import MAX_RANK, combine_adapters
from multilora_studio.util import ProgressCallback, sha256_file


@dataclass(frozen=True)
class MergeInputs:
    """The adapters to merge (folders and what the card says of them) and the base to merge into."""

    base_folder: Path
    base: BaseSource
    base_ref: BaseModelRef
    adapter_folders: tuple[Path, ...]
    adapters: tuple[AdapterSource, ...]


def resolve_merge_inputs(
    registry: Registry,
    names: Sequence[str],
    weights: Sequence[float],
    into_base: str | None,
    allow_other_base: bool,
    progress: ProgressCallback | None = None,
) -> MergeInputs:
    """Find each adapter (a library name or alias, else a folder) and the base.

    The base is ``into_base`` (a registered base's name or a model folder), else the base the
    library validated the first adapter against when it knows that base's folder, else the
    embedded model. An adapter the library validated against other weights is refused unless
    ``allow_other_base``.
    """
    if len(names) != len(weights):
        raise MergeError(f"{len(names)} adapters and {len(weights)} weights")
    records = [registry.find(name) for name in names]
    for name, record in zip(names, records, strict=True):
        if record is None and not Path(name).expanduser().is_dir():
            raise MergeError(f"{name!r} is neither an adapter of the library nor a folder")
    base_folder, base = _resolve_base(registry, into_base, records, progress)
    spec = load_spec(base_folder)
    base_ref = BaseModelRef.of_spec(base.name, base.digest, spec)
    folders, sources = [], []
    for name, record, weight in zip(names, records, weights, strict=True):
        if record is not None and not allow_other_base:
            _refuse_other_base(record, base)
        folder = record.path if record is not None else Path(name).expanduser().resolve()
        summary = inspect_peft_adapter(folder, spec.num_layers, spec.projection_shape, MAX_RANK, spec.vocab)
        kind = summary.kind + (f", {summary.tokens}" if summary.tokens else "")
        folders.append(folder)
        sources.append(
            AdapterSource(
                name=record.name if record is not None else folder.name,
                source=record.source if record is not None else str(folder),
                revision=(record.revision or "") if record is not None else "",
                digest=sha256_file(weights_file(folder)),
                rank=summary.rank,
                targets=summary.targets,
                kind=kind,
                weight=weight,
            )
        )
    return MergeInputs(base_folder, base, base_ref, tuple(folders), tuple(sources))


def merge_into_library(
    registry: Registry,
    inputs: MergeInputs,
    out: Path,
    dtype: torch.dtype | None,
    shard_bytes: int,
    combination: str,
    name: str | None,
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
) -> tuple[MergedModel, BaseModelRecord]:
    """Merge and export, then register the folder as a base model named ``name`` (default: the
    folder's name). The name is checked free before the merge starts."""
    out = Path(out).expanduser().resolve()
    base_name = name or out.name
    registry.check_base_name(base_name)
    result = merge_and_export(
        MergeRequest(
            inputs.base_folder,
            inputs.base,
            inputs.adapter_folders,
            inputs.adapters,
            out,
            dtype,
            shard_bytes,
            combination,
        ),
        progress,
        cancel,
    )
    origin = {
        "base": dataclasses.asdict(inputs.base),
        "adapters": [dataclasses.asdict(item) for item in inputs.adapters],
        "combination": combination if len(inputs.adapters) > 1 else None,
        "dtype": DTYPE_NAMES[result.dtype],
    }
    record = registry.register_merged_base(base_name, result.path, result.digest, json.dumps(origin))
    return result, record


def combine_into_library(
    registry: Registry, inputs: MergeInputs, combination: str, out: Path, name: str | None
) -> AdapterRecord:
    """Write the weighted combination of the adapters at ``out`` and import it into the library."""
    if len(inputs.adapters) < 2:
        raise MergeError("combining into a new adapter takes two or more adapters")
    out = Path(out).expanduser().resolve()
    if out.exists():
        raise MergeError(f"{out} already exists; choose a new folder for the combined adapter")
    registry.check_names(name or out.name)
    combine_adapters(
        inputs.adapter_folders,
        [item.weight for item in inputs.adapters],
        combination,
        out,
        inputs.base_ref.num_layers,
    )
    listed = ", ".join(f"{item.name} x {item.weight:g}" for item in inputs.adapters)
    return registry.import_folder(
        out,
        inputs.base_ref,
        name=name or out.name,
        notes=f"{combination} combination of {listed}",
        max_rank=MAX_RANK,
    )


def _resolve_base(
    registry: Registry,
    into_base: str | None,
    records: Sequence[AdapterRecord | None],
    progress: ProgressCallback | None,
) -> tuple[Path, BaseSource]:
    registered: BaseModelRecord | None = None
    if into_base is not None:
        registered = next((b for b in registry.list_base_models() if b.repo_id == into_base), None)
    else:
        digests = [record.base_digest for record in records if record is not None and record.base_digest]
        registered = registry.find_base_model(digests[0]) if digests else None
    if registered is not None:
        repo = "" if registered.revision == MERGED_REVISION else registered.repo_id
        revision = "" if registered.revision == MERGED_REVISION else registered.revision
        return registered.path, BaseSource(registered.repo_id, repo, revision, registered.digest)
    identity = describe_model(into_base, progress)
    return identity.folder, BaseSource(identity.name, "", "", identity.digest)


def _refuse_other_base(record: AdapterRecord, base: BaseSource) -> None:
    if record.base_digest and base.digest and record.base_digest != base.digest:
        raise MergeError(
            f"adapter {record.name!r} was validated against other base weights "
            f"({record.base_name}, {record.base_digest[:12]}) than {base.name} "
            f"({base.digest[:12]}); allow another base to merge it anyway"
        )
