"""A new user's data directory for the docs' examples: the embedded model converted once, demo adapters on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs.examples import Reader


@pytest.fixture
def reader(default_model, tmp_path: Path) -> Iterator[Reader]:
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(default_model.path.parent, target_is_directory=True)
    work = tmp_path / "work"
    work.mkdir()
    reader = Reader(home, work)
    try:
        yield reader
    finally:
        reader.close()
        print("".join(f"\n{seconds:7.1f} s  {where}" for where, seconds in reader.seconds.items()))
