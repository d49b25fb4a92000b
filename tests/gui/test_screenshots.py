"""docs/screenshots holds what scripts/screenshots.py takes: one PNG per view the window lists (and
the script's extras) at the window's default size, and nothing else."""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path
from types import ModuleType

from multilora_studio.gui.main_window import DEFAULT_SIZE, PAGES

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "docs" / "screenshots"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("screenshots", ROOT / "scripts" / "screenshots.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_SIGNATURE and head[12:16] == b"IHDR", f"{path.name} is not a PNG"
    return struct.unpack(">II", head[16:24])


def test_every_view_the_window_lists_has_a_screenshot():
    shots = script()
    missing = [view for view in PAGES if not (SCREENSHOTS / shots.view_file(view)).is_file()]
    assert missing == [], "run scripts/screenshots.py (its docstring says how)"


def test_the_screenshots_are_the_scripts_at_the_default_window_size():
    taken = script().screenshot_files(PAGES)
    assert sorted(path.name for path in SCREENSHOTS.glob("*.png")) == sorted(taken)
    assert {name: png_size(SCREENSHOTS / name) for name in taken} == dict.fromkeys(taken, DEFAULT_SIZE)
