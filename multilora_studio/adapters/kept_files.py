"""The files the library keeps of an adapter (an import copies them, an archive packs them, a
restore unpacks them): each by its bare name, with the most bytes it may have."""

from __future__ import annotations

import os
from pathlib import Path

from multilora_studio.adapters.adapter_config import (
    CONFIG_FILE,
    MAX_ADAPTER_BYTES,
    MAX_CONFIG_BYTES,
    WEIGHTS_FILE,
)
from multilora_studio.adapters.adapter_files import open_adapter_file
from multilora_studio.adapters.adapter_tokenizer import TOKENIZER_FILE_CAPS
from multilora_studio.adapters.score_import import MAX_MODEL_CARD_BYTES, MODEL_CARD

KEPT_FILES = {
    CONFIG_FILE: MAX_CONFIG_BYTES,
    WEIGHTS_FILE: MAX_ADAPTER_BYTES,
    MODEL_CARD: MAX_MODEL_CARD_BYTES,
    **TOKENIZER_FILE_CAPS,
}


def kept_files_in(folder: Path) -> list[str]:
    """The names of ``KEPT_FILES`` that ``folder`` has (links included), in the table's order."""
    return [name for name in KEPT_FILES if os.path.lexists(folder / name)]


def check_kept_files(folder: Path) -> None:
    """AdapterError naming the first of ``folder``'s kept files that is a link (other than the
    Hugging Face cache's own), not a regular file, or larger than its cap."""
    for name in kept_files_in(folder):
        os.close(open_adapter_file(folder / name, KEPT_FILES[name]))
