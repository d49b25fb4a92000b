"""Small helpers the package shares: a file's SHA-256, the type of progress callbacks and how to
install an optional extra."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable
from pathlib import Path

from multilora_studio import __version__

ProgressCallback = Callable[[float, str], None]  # progress(fraction done in [0, 1], message)


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    """Hex SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def extra_install_hint(extra: str) -> str:
    """The commands that install the optional ``extra`` (pyproject's optional dependencies): the
    package is installed from a checkout or from its wheel, not from the package index."""
    wheel = f"multilora_studio-{__version__}-py3-none-any.whl"
    return f'pip install -e ".[{extra}]" in a checkout, or pip install "{wheel}[{extra}]" with the wheel'


def window_requirement() -> str:
    """The PySide6 the window needs on this Python (pyproject's dependency, with its marker
    applied: 6.12 aborts the window below Python 3.12)."""
    return "PySide6-Essentials>=6.6,<6.12" if sys.version_info < (3, 12) else "PySide6-Essentials>=6.6"
