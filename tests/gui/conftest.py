"""GUI fixtures: offscreen Qt, a real library, real engines on the tiny model, screenshots."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before any QApplication exists

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QWidget

from multilora_studio.adapters.base_model import BaseModelRef
from multilora_studio.adapters.registry import Registry
from multilora_studio.cli.shared import describe_base
from multilora_studio.gui.main_window import MainWindow
from multilora_studio.gui.preferences import EngineChoice, Preferences
from multilora_studio.gui.theme import apply_theme, set_theme
from tests.fixtures import AdapterSpec, build_adapter

SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-output" / "screenshots"
ENGINE_TIMEOUT_MS = 120_000
LLAMA_ADAPTERS = ("tiny-r8-all", "tiny-r4-qv")  # the first base's adapters in ``two_bases``
QWEN_ADAPTER = AdapterSpec("qwen-r8", 8, 16, ("q_proj", "v_proj", "down_proj"), 51)


def save_screenshot(widget: QWidget, name: str) -> Path:
    """Save a PNG of ``widget`` under test-output/screenshots/ for a person to look at."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    assert widget.grab().save(str(path)), f"could not write {path}"
    return path


@pytest.fixture(scope="session")
def tiny_base(tiny_model_dir: Path) -> BaseModelRef:
    return describe_base(str(tiny_model_dir))


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    """A fresh library on a real SQLite file."""
    return Registry(tmp_path / "library")


@pytest.fixture
def tiny_choice(tiny_model_dir: Path, engine_device: str) -> EngineChoice:
    return EngineChoice(
        model_source="folder",
        model=str(tiny_model_dir),
        device=engine_device,
        dtype="float32",
        max_loras=4,
        max_lora_rank=32,
    )


@pytest.fixture(scope="session")
def qwen_base(tiny_family_models, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A second base (a tiny Qwen2, attention bias) and a PEFT adapter trained on it."""
    folder = tiny_family_models["qwen2"]
    return folder, build_adapter(folder, QWEN_ADAPTER, tmp_path_factory.mktemp("qwen-adapter") / "qwen-r8")


@pytest.fixture
def two_bases(
    registry: Registry, tiny_base, tiny_adapters, qwen_base, make_prefs, tiny_choice: EngineChoice
) -> EngineChoice:
    """A library with adapters of both bases, and Settings that serve both (``extra_models``)."""
    folder, adapter = qwen_base
    for name in LLAMA_ADAPTERS:
        registry.import_folder(tiny_adapters[name], tiny_base, max_rank=32)
    registry.import_folder(adapter, describe_base(str(folder)), name="qwen-r8", max_rank=32)
    choice = replace(tiny_choice, extra_models=(str(folder),))
    make_prefs().set_engine_choice(choice)
    return choice


@pytest.fixture
def settings_file(tmp_path: Path) -> Path:
    return tmp_path / "settings.ini"


@pytest.fixture
def make_prefs(settings_file: Path, tiny_choice: EngineChoice) -> Callable[[], Preferences]:
    """Preferences on an INI file of the test; the first call stores the tiny-model engine settings."""

    def build() -> Preferences:
        fresh = not settings_file.exists()
        prefs = Preferences(QSettings(str(settings_file), QSettings.Format.IniFormat))
        if fresh:
            prefs.set_engine_choice(tiny_choice)
        return prefs

    return build


@pytest.fixture
def open_window(qtbot, qapp, registry: Registry, make_prefs) -> Iterator[Callable[..., MainWindow]]:
    """Open a MainWindow over the tiny model and wait until its engine is ready; closed after the test."""
    apply_theme(qapp)
    windows: list[MainWindow] = []

    def open_(wait: bool = True) -> MainWindow:
        window = MainWindow(make_prefs(), registry)
        windows.append(window)
        window.show()
        if wait:
            wait_ready(qtbot, window)
        return window

    yield open_
    for window in windows:
        window.close()
    set_theme(qapp, "system")


def wait_ready(qtbot, window: MainWindow) -> None:
    qtbot.waitUntil(lambda: window.host.state in ("ready", "failed"), timeout=ENGINE_TIMEOUT_MS)
    assert window.host.state == "ready", window.host.error


def wait_task(qtbot, task, timeout_ms: int = 60_000) -> None:
    """Wait until a Task has finished and its result signals reached the GUI thread."""
    assert task is not None
    qtbot.waitUntil(lambda: task.delivered, timeout=timeout_ms)
