"""Small helpers the package shares: a file's SHA-256 and the type of progress callbacks."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

ProgressCallback = Callable[[float, str], None]  # progress(fraction done in [0, 1], message)


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    """Hex SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()
