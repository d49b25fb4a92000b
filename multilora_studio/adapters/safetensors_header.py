"""Read and check a safetensors header before any tensor data is read.

Layout: 8 bytes little-endian header length N, N bytes of JSON
(``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``),
then the data; offsets are relative to the end of the header. Every declared
size is checked against the file, so a header that claims terabytes is refused
before anything is allocated.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from multilora_studio.adapters.adapter_config import AdapterError

MAX_HEADER_BYTES = 100 << 20  # the safetensors library's own limit
DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as the header declares it."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def read_header(path: Path) -> dict[str, TensorEntry]:
    """The tensors declared in ``path``; AdapterError if the header or any declared size is inconsistent."""
    size = path.stat().st_size
    bad = f"{path} is corrupt or truncated"
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise AdapterError(f"{bad}: {size} bytes, shorter than a safetensors header")
        (length,) = struct.unpack("<Q", prefix)
        if length > MAX_HEADER_BYTES or 8 + length > size:
            raise AdapterError(f"{bad}: it declares a {length}-byte header in a {size}-byte file")
        raw = handle.read(length)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise AdapterError(f"{bad}: its header is not valid JSON ({error})") from None
    except RecursionError:
        raise AdapterError(f"{path}: JSON nested too deeply") from None
    if not isinstance(header, dict):
        raise AdapterError(f"{bad}: its header is not a JSON object")
    data_bytes = size - 8 - length
    entries = {}
    for name, value in header.items():
        if name == "__metadata__":
            continue
        entries[name] = _entry(name, value, bad, data_bytes)
    return entries


def data_offset(path: Path) -> int:
    """Where the tensor data of ``path`` begins (``TensorEntry`` offsets count from there)."""
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
    return 8 + length


def _entry(name: str, value: object, bad: str, data_bytes: int) -> TensorEntry:
    if not isinstance(value, dict):
        raise AdapterError(f"{bad}: the header entry of {name!r} is not an object")
    dtype, shape, offsets = value.get("dtype"), value.get("shape"), value.get("data_offsets")
    if dtype not in DTYPE_BYTES:
        raise AdapterError(f"{bad}: tensor {name!r} has unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise AdapterError(f"{bad}: tensor {name!r} has an invalid shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
        raise AdapterError(f"{bad}: tensor {name!r} has invalid data_offsets {offsets!r}")
    begin, end = offsets
    declared = math.prod(shape) * DTYPE_BYTES[dtype]
    if declared > data_bytes:
        raise AdapterError(
            f"{bad}: tensor {name!r} declares shape {shape} ({declared} bytes) but the file holds "
            f"{data_bytes} bytes of data"
        )
    if end < begin or end - begin != declared or end > data_bytes:
        raise AdapterError(
            f"{bad}: tensor {name!r} spans bytes {begin}..{end} of {data_bytes}, "
            f"its shape {shape} needs {declared}"
        )
    return TensorEntry(dtype, tuple(shape), begin, end)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
