"""Which safetensors files hold a checkpoint (one file or an index of shards), and their digest."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from multilora_studio.util import sha256_file

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def checkpoint_files(folder: Path) -> list[Path]:
    """The checkpoint's safetensors files: the shards an index lists (sorted), or ``model.safetensors``.

    ValueError / FileNotFoundError name the problem (pickle-only weights, a broken index or one
    naming a shard outside the folder, a missing shard, no weights at all).
    """
    folder = Path(folder)
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            names = sorted(set(weight_map.values()))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            raise ValueError(f"{index} is not a safetensors index (no weight_map)") from None
        outside = [name for name in names if not _bare_file_name(name)]
        if outside:
            raise ValueError(
                f"{index} names shard {outside[0]!r}, which is not a file of {folder}; an index may name "
                "only files in its own folder"
            )
        files = [folder / name for name in names]
        for path in files:
            if not path.is_file():
                raise FileNotFoundError(f"{path} is listed in the safetensors index but missing")
        return files
    single = folder / SINGLE_FILE
    if single.is_file():
        return [single]
    if any(folder.glob("*.bin")) or any(folder.glob("*.pt")):
        raise ValueError(
            f"{folder} holds only pickle weights (.bin/.pt), which can run code when loaded; "
            "convert them to safetensors first"
        )
    raise FileNotFoundError(f"{folder} has no {SINGLE_FILE} (nor {INDEX_FILE} with its shards)")


def _bare_file_name(name: object) -> bool:
    """``name`` names a file directly in a folder: no separator, not "", "." or ".."."""
    return isinstance(name, str) and name not in ("", ".", "..") and Path(name).name == name


def checkpoint_digest(files: list[Path]) -> str:
    """Hex SHA-256 identifying the weights (``digest_of_shards`` of the files' own SHA-256s)."""
    return digest_of_shards([(path.name, sha256_file(path)) for path in files])


def digest_of_shards(shards: list[tuple[str, str]]) -> str:
    """The digest of ``(file name, file SHA-256)`` pairs: that of the file itself for one file;
    for shards, the SHA-256 of every shard's name and content digest in order (equal for copies
    of the folder, different after re-sharding)."""
    if len(shards) == 1:
        return shards[0][1]
    digest = hashlib.sha256()
    for name, file_digest in shards:
        digest.update(f"{name}\0{file_digest}\n".encode())
    return digest.hexdigest()
