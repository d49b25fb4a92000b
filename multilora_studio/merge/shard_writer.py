"""Write a checkpoint as sharded safetensors one tensor at a time, in bounded host memory.

Every tensor's name, shape and dtype is known before any data is computed, so each shard's
header (offsets included) is written first and each tensor's bytes are streamed after it:
host memory holds one tensor at a time, whatever the shard size. Layout of a file: 8 bytes
little-endian header length N, N bytes of JSON padded with spaces to a multiple of 8, then
the tensors' bytes in header order (row-major, little-endian).
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from multilora_studio.checkpoint_files import INDEX_FILE, SINGLE_FILE, digest_of_shards

SAFETENSORS_DTYPES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


@dataclass(frozen=True)
class PlannedTensor:
    """A tensor the checkpoint will hold, before its values exist."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()


@dataclass(frozen=True)
class WrittenCheckpoint:
    """The files written and their digest (``checkpoint_files.checkpoint_digest`` of them)."""

    files: tuple[Path, ...]
    digest: str
    total_bytes: int


def plan_shards(tensors: Iterable[PlannedTensor], shard_bytes: int) -> list[list[PlannedTensor]]:
    """Tensors in order, a new shard whenever the next one would pass ``shard_bytes`` (a tensor
    larger than that gets a shard of its own)."""
    shards: list[list[PlannedTensor]] = [[]]
    size = 0
    for tensor in tensors:
        if shards[-1] and size + tensor.nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(tensor)
        size += tensor.nbytes
    return [shard for shard in shards if shard]


def shard_names(count: int) -> list[str]:
    """``model.safetensors``, or transformers' ``model-00001-of-00003.safetensors`` names."""
    if count == 1:
        return [SINGLE_FILE]
    return [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def write_checkpoint(
    folder: Path,
    shards: list[list[PlannedTensor]],
    values: Callable[[PlannedTensor], torch.Tensor],
    metadata: dict[str, str] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> WrittenCheckpoint:
    """Write ``shards`` into ``folder`` (and the index when there are several).

    ``values(tensor)`` computes one tensor; it must match the plan's shape and dtype
    (ValueError otherwise). ``progress(done, total)`` counts tensors.
    """
    names = shard_names(len(shards))
    total = sum(len(shard) for shard in shards)
    done = 0
    files, digests = [], []
    for name, shard in zip(names, shards, strict=True):
        path = folder / name
        digest = hashlib.sha256()
        with path.open("wb") as handle:
            header = _header_bytes(shard, metadata or {})
            handle.write(header)
            digest.update(header)
            for planned in shard:
                data = _bytes_of(planned, values(planned))
                handle.write(data)
                digest.update(data)
                done += 1
                if progress is not None:
                    progress(done, total)
        files.append(path)
        digests.append((name, digest.hexdigest()))
    total_bytes = sum(t.nbytes for shard in shards for t in shard)
    if len(shards) > 1:
        weight_map = {t.name: name for name, shard in zip(names, shards, strict=True) for t in shard}
        index = {"metadata": {"total_size": total_bytes}, "weight_map": dict(sorted(weight_map.items()))}
        (folder / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return WrittenCheckpoint(tuple(files), digest_of_shards(digests), total_bytes)


def _header_bytes(shard: list[PlannedTensor], metadata: dict[str, str]) -> bytes:
    entries: dict[str, object] = {"__metadata__": {"format": "pt", **metadata}}
    offset = 0
    for tensor in shard:
        if tensor.dtype not in SAFETENSORS_DTYPES:
            raise ValueError(f"{tensor.name}: dtype {tensor.dtype} has no safetensors name")
        entries[tensor.name] = {
            "dtype": SAFETENSORS_DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + tensor.nbytes],
        }
        offset += tensor.nbytes
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _bytes_of(planned: PlannedTensor, tensor: torch.Tensor) -> bytes:
    if tuple(tensor.shape) != planned.shape or tensor.dtype != planned.dtype:
        raise ValueError(
            f"{planned.name}: computed {tuple(tensor.shape)} {tensor.dtype}, "
            f"planned {planned.shape} {planned.dtype}"
        )
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)  # [numel]
    return flat.view(torch.uint8).numpy().tobytes()
