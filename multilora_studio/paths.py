"""Where MultiLoRA Studio keeps its data on disk."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "multilora-studio"
HOME_ENV = "MULTILORA_STUDIO_HOME"


def data_dir() -> Path:
    """The user data directory (``$MULTILORA_STUDIO_HOME`` overrides the platform default)."""
    override = os.environ.get(HOME_ENV)
    root = Path(override) if override else Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    root.mkdir(parents=True, exist_ok=True)
    return root


def models_dir() -> Path:
    """Converted base models live here, one folder each."""
    path = data_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def runs_dir() -> Path:
    """The history of runs (one JSON record each, ``run_records.py``)."""
    return data_dir() / "runs"
