"""Where MultiLoRA Studio keeps its data on disk."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "multilora-studio"
HOME_ENV = "MULTILORA_STUDIO_HOME"
PRIVATE_DIR = 0o700  # the data directory holds the user's adapters and runs: no one else reads it


def data_dir_path() -> Path:
    """The user data directory (``$MULTILORA_STUDIO_HOME`` overrides the platform default), unmade."""
    override = os.environ.get(HOME_ENV)
    return Path(override) if override else Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))


def data_dir() -> Path:
    """The user data directory, created private to the user (0700) if missing."""
    root = data_dir_path()
    if not root.is_dir():
        root.parent.mkdir(parents=True, exist_ok=True)
        root.mkdir(mode=PRIVATE_DIR, exist_ok=True)
        os.chmod(root, PRIVATE_DIR)
    return root


def models_dir() -> Path:
    """Converted base models live here, one folder each."""
    path = data_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def runs_dir() -> Path:
    """The history of runs (one JSON record each, ``run_records.py``)."""
    return data_dir() / "runs"


def command_defaults_path() -> Path:
    """The command line's defaults file (``cli/defaults_file.py``), which may not exist."""
    return data_dir_path() / "config.toml"
