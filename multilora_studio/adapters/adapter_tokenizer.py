"""The tokenizer and chat template an adapter folder brings, when they differ from the base's.

A chat fine-tune that adds special tokens or changes the template saves its tokenizer next
to the adapter; its prompts must be encoded, and its outputs decoded, with that tokenizer,
and its chat requests rendered with that template, never silently with the base's.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multilora_studio.adapters.adapter_config import ADDED_TOKENS_FILE, AdapterError
from multilora_studio.adapters.adapter_files import read_adapter_file

# Files of which at least one is in a folder that has a tokenizer (the fast, sentencepiece,
# BPE-vocabulary and tiktoken forms).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer.tiktoken", "tiktoken.model")
TEMPLATE_FILE = "chat_template.jinja"
# every file a tokenizer folder may hold (what the library copies and pulls with an adapter)
TOKENIZER_FOLDER_FILES = (
    *TOKENIZER_FILES,
    "merges.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
    TEMPLATE_FILE,
)
MAX_TEMPLATE_BYTES = 1 << 20
MAX_TOKENIZER_FILE_BYTES = 64 << 20  # the largest tokenizers (256k-token vocabularies) are ~35 MB
# the most bytes read of each file an adapter's tokenizer is made of
TOKENIZER_FILE_CAPS = {
    **{name: MAX_TOKENIZER_FILE_BYTES for name in (*TOKENIZER_FOLDER_FILES, ADDED_TOKENS_FILE)},
    TEMPLATE_FILE: MAX_TEMPLATE_BYTES,
}


def load_tokenizer(folder: Path) -> Any:
    """The folder's tokenizer, or None when it has no tokenizer files."""
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


@dataclass(frozen=True)
class AdapterTokenizer:
    """An adapter's own tokenizer (its vocabulary, its template, or both differ from the base's)."""

    tokenizer: Any
    own_vocabulary: bool
    own_template: bool
    extends_base: bool  # every base token keeps its id (it only adds tokens, if any)

    @property
    def label(self) -> str:
        """What the library shows: "own tokenizer / template", "own tokenizer" or "own template"."""
        if self.own_vocabulary and self.own_template:
            return "own tokenizer / template"
        return "own tokenizer" if self.own_vocabulary else "own template"

    @property
    def eos_token_ids(self) -> frozenset[int]:
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return frozenset() if eos is None else frozenset([int(eos)])


def tokenizer_files_label(folder: Path) -> str:
    """What the folder brings by its files alone: "own tokenizer / template", "own tokenizer",
    "own template" or "" (the engine compares them with the base's when it serves them)."""
    has_tokenizer = any(os.path.lexists(folder / name) for name in TOKENIZER_FILES)
    config = folder / "tokenizer_config.json"
    has_template = os.path.lexists(folder / TEMPLATE_FILE) or (
        os.path.lexists(config) and b'"chat_template"' in read_adapter_file(config, MAX_TOKENIZER_FILE_BYTES)
    )
    if not has_tokenizer and not has_template:
        return ""
    return AdapterTokenizer(None, has_tokenizer, has_template, True).label


def adapter_tokenizer(folder: Path, base: Any, vocab_size: int) -> AdapterTokenizer | None:
    """The folder's tokenizer (or the base's with the folder's ``chat_template.jinja``) when it
    differs from ``base``; None when the folder has neither or they equal the base's.

    Each file is read once, without following a link and within ``TOKENIZER_FILE_CAPS``
    (``adapter_files``), and the tokenizer made from those bytes, never from the folder.
    AdapterError when the files cannot be read or the tokenizer has more tokens than the
    adapter's vocabulary (``vocab_size``: the base's, or its resized embeddings').
    """
    files = {
        name: read_adapter_file(folder / name, cap)
        for name, cap in TOKENIZER_FILE_CAPS.items()
        if os.path.lexists(folder / name)
    }
    has_tokenizer = any(name in files for name in TOKENIZER_FILES)
    if not has_tokenizer and TEMPLATE_FILE not in files:
        return None
    try:
        if has_tokenizer:
            tokenizer = _tokenizer_of(files)
        else:
            if base is None:
                return None  # a template without any tokenizer to render it with
            tokenizer = copy.deepcopy(base)
            tokenizer.chat_template = files[TEMPLATE_FILE].decode()
    except (OSError, ValueError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise AdapterError(f"{folder}: its tokenizer files cannot be read: {error}") from None
    if len(tokenizer) > vocab_size:
        raise AdapterError(
            f"{folder}: its tokenizer has {len(tokenizer)} tokens, but the adapter's vocabulary "
            f"(embeddings) has {vocab_size}; save the adapter with its resized embed_tokens and lm_head"
        )
    vocabulary = tokenizer.get_vocab()
    base_vocabulary = base.get_vocab() if base is not None else {}
    own_vocabulary = base is None or vocabulary != base_vocabulary
    own_template = getattr(tokenizer, "chat_template", None) != getattr(base, "chat_template", None)
    if not own_vocabulary and not own_template:
        return None
    extends = base is not None and all(vocabulary.get(t) == i for t, i in base_vocabulary.items())
    return AdapterTokenizer(tokenizer, own_vocabulary, own_template, extends)


def _tokenizer_of(files: dict[str, bytes]) -> Any:
    """The tokenizer made of ``files`` (name -> bytes), written to a private folder of its own."""
    with tempfile.TemporaryDirectory(prefix="adapter-tokenizer-") as folder:
        for name, data in files.items():
            (Path(folder) / name).write_bytes(data)
        return load_tokenizer(Path(folder))
