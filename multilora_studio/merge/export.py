"""Merge adapters into a base and write a Hugging Face model folder that transformers, vLLM and
this app load: sharded safetensors (with their index), config.json, the tokenizer, the
generation config and a model card.

The folder is written next to its destination as ``NAME.partial`` and renamed into place at
the end, so a failure (a full disk, a cancel) leaves no half-written model under the name; the
base and the adapters are only read, and a ``NAME.partial`` that exists already is refused,
never deleted (another merge's, or the user's). Host memory holds the adapters' factors and one base
tensor at a time, in float32, plus its merged copy: for a Llama-3-8B base about 4.2 GB at the
embedding (128,256 x 4,096, twice in float32), 0.5 GB for its largest projection.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from multilora_studio import __version__
from multilora_studio.adapters.adapter_files import read_adapter_file
from multilora_studio.adapters.adapter_tokenizer import (
    TOKENIZER_FILE_CAPS,
    TOKENIZER_FILES,
    TOKENIZER_FOLDER_FILES,
)
from multilora_studio.adapters.peft_adapter import load_peft_adapter
from multilora_studio.engine.model.model_spec import load_spec
from multilora_studio.merge.merged_weights import MergedWeights, MergeError
from multilora_studio.merge.model_card import AdapterSource, BaseSource, model_card
from multilora_studio.merge.shard_writer import PlannedTensor, plan_shards, write_checkpoint
from multilora_studio.merge.weighted_adapters import MAX_RANK, combine_adapters
from multilora_studio.util import ProgressCallback

OUTPUT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
# files of a model folder copied as they are (config.json is rewritten, the weights merged)
CARRIED_FILES = ("generation_config.json", *TOKENIZER_FOLDER_FILES)


class MergeCancelled(RuntimeError):
    """The merge was cancelled; nothing was left at the destination."""


@dataclass(frozen=True)
class MergeRequest:
    """What to merge: adapters (with weights and how to combine several), into which base, how."""

    base_folder: Path
    base: BaseSource
    adapter_folders: tuple[Path, ...]
    adapters: tuple[AdapterSource, ...]
    out: Path
    dtype: torch.dtype | None = None  # None: the base checkpoint's own float dtype
    shard_bytes: int = 5 * 10**9
    combination: str = "linear"  # for several adapters: merge.weighted_adapters.COMBINATIONS


@dataclass(frozen=True)
class MergedModel:
    """The folder written, its weights' digest (``checkpoint_digest``) and size."""

    path: Path
    digest: str
    files: tuple[Path, ...]
    total_bytes: int
    dtype: torch.dtype


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(KIB|MIB|GIB|KB|MB|GB|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "KB": 10**3, "MB": 10**6, "GB": 10**9, "B": 1}


def parse_shard_size(text: str) -> int:
    """ "5GB", "500MB", "2GiB" or a byte count -> bytes (transformers' max_shard_size units)."""
    found = _SIZE.match(text)
    if found is None:
        raise MergeError(f"shard size {text!r} is not a size like 5GB, 500MB or 2GiB")
    value = int(float(found[1]) * _SIZE_UNITS[(found[2] or "B").upper()])
    if value < 10**6:
        raise MergeError(f"shard size {text!r} is below 1MB")
    return value


def merge_and_export(
    request: MergeRequest,
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
) -> MergedModel:
    """Merge ``request``'s adapters into its base and write the folder at ``request.out``.

    MergeError / AdapterError (ValueErrors) name what cannot be merged, before anything is
    written; OSError (a full disk) and MergeCancelled leave nothing at the destination.
    """
    out = Path(request.out).expanduser()
    if out.exists():
        raise MergeError(f"{out} already exists; choose a new folder for the merged model")
    if len(request.adapter_folders) != len(request.adapters) or not request.adapters:
        raise MergeError("name one or more adapters to merge")
    spec = load_spec(request.base_folder)
    report = progress or (lambda fraction, message: None)
    partial = out.with_name(out.name + ".partial")
    try:
        partial.mkdir(parents=True)
    except FileExistsError:
        raise MergeError(
            f"{partial} exists (another merge to {out.name} under way, or one that was interrupted); "
            "delete it, or choose another folder for the merged model"
        ) from None
    try:
        with tempfile.TemporaryDirectory(dir=partial.parent, prefix=f".{out.name}-combined-") as scratch:
            adapter_folder = _single_adapter(request, spec.num_layers, Path(scratch))
            adapter = load_peft_adapter(
                request.adapters[0].name if len(request.adapters) == 1 else out.name,
                adapter_folder,
                spec.num_layers,
                spec.projection_shape,
                MAX_RANK,
                spec.vocab,
            )
            dtype = request.dtype or _stored_dtype(request)
            merged = MergedWeights(request.base_folder, spec, adapter, dtype)
            planned = merged.plan()
            shards = plan_shards(planned, request.shard_bytes)
            report(0.0, f"merging {len(planned)} tensors into {len(shards)} shard(s)")

            def value(tensor: PlannedTensor) -> torch.Tensor:
                if cancel is not None and cancel.is_set():
                    raise MergeCancelled("the merge was cancelled")
                return merged.value(tensor)

            written = write_checkpoint(
                partial,
                shards,
                value,
                metadata={"merged_by": f"multilora-studio {__version__}"},
                progress=lambda done, total: report(0.95 * done / total, f"merged {done}/{total} tensors"),
            )
            _write_config(request.base_folder, partial, merged.config_changes, dtype)
            _carry_files(request.base_folder, _tokenizer_source(request), partial)
            (partial / "README.md").write_text(
                model_card(
                    out.name,
                    request.base,
                    request.adapters,
                    request.combination if len(request.adapters) > 1 else None,
                    DTYPE_NAMES[dtype],
                    time.strftime("%Y-%m-%d", time.gmtime()),
                    __version__,
                )
            )
        partial.rename(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    report(1.0, f"wrote {out}")
    files = tuple(out / path.name for path in written.files)
    return MergedModel(out, written.digest, files, written.total_bytes, dtype)


def _single_adapter(request: MergeRequest, num_layers: int, scratch: Path) -> Path:
    """The one adapter folder to merge: the adapter itself, or the weighted combination of several."""
    if len(request.adapter_folders) == 1:
        if request.adapters[0].weight != 1.0:
            raise MergeError("a weight applies to combining several adapters; merge one adapter at 1.0")
        return request.adapter_folders[0]
    return combine_adapters(
        request.adapter_folders,
        [item.weight for item in request.adapters],
        request.combination,
        scratch / "combined",
        num_layers,
    )


def _stored_dtype(request: MergeRequest) -> torch.dtype:
    """The base's own float dtype (config.json's ``dtype`` / ``torch_dtype``, else float32)."""
    config = json.loads((request.base_folder / "config.json").read_text())
    name = config.get("dtype") or config.get("torch_dtype") or "float32"
    for dtype, known in DTYPE_NAMES.items():
        if known == name:
            return dtype
    return torch.float32


def _write_config(base_folder: Path, out: Path, changes: dict[str, object], dtype: torch.dtype) -> None:
    config = json.loads((base_folder / "config.json").read_text())
    # gemma3's image-text config keeps the decoder's vocabulary in text_config
    target = config["text_config"] if isinstance(config.get("text_config"), dict) else config
    target.update(changes)
    if "tie_word_embeddings" in changes and target is not config:
        config["tie_word_embeddings"] = changes["tie_word_embeddings"]
    present = [key for key in ("dtype", "torch_dtype") if key in config] or ["torch_dtype"]
    for key in present:
        config[key] = DTYPE_NAMES[dtype]
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def _tokenizer_source(request: MergeRequest) -> Path:
    """Where the tokenizer comes from: an adapter's own (added tokens, a new template), else the base's."""
    for folder in request.adapter_folders:
        if any((folder / name).is_file() for name in TOKENIZER_FILES):
            return folder
    return request.base_folder


def _carry_files(base_folder: Path, tokenizer_folder: Path, out: Path) -> None:
    """The generation config from the base, every tokenizer file from ``tokenizer_folder`` (an
    adapter's, read as every file an adapter brings is: ``adapter_files``)."""
    for name in CARRIED_FILES:
        source = (tokenizer_folder if name in TOKENIZER_FOLDER_FILES else base_folder) / name
        if tokenizer_folder != base_folder and name in TOKENIZER_FOLDER_FILES:
            if os.path.lexists(source):
                (out / name).write_bytes(read_adapter_file(source, TOKENIZER_FILE_CAPS[name]))
        elif source.is_file():
            shutil.copyfile(source, out / name)
