"""Icons, the desktop entry template, demo adapters and their example prompt set (import name
``multilora_studio.resources``)."""

from importlib.resources import files
from pathlib import Path


def resource_path(*parts: str) -> Path:
    """Filesystem path of a bundled resource (works from a checkout and from the wheel)."""
    return Path(str(files(__name__).joinpath(*parts)))
