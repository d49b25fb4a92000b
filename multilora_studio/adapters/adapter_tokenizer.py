"""The tokenizer and chat template an adapter folder brings, when they differ from the base's.

A chat fine-tune that adds special tokens or changes the template saves its tokenizer next
to the adapter; its prompts must be encoded, and its outputs decoded, with that tokenizer,
and its chat requests rendered with that template, never silently with the base's.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multilora_studio.adapters.adapter_config import AdapterError, refuse_unless_regular

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
    has_tokenizer = any((folder / name).is_file() for name in TOKENIZER_FILES)
    config = folder / "tokenizer_config.json"
    in_config = config.is_file() and config.stat().st_size < MAX_TEMPLATE_BYTES
    has_template = (folder / TEMPLATE_FILE).is_file() or (
        in_config and '"chat_template"' in config.read_text()
    )
    if not has_tokenizer and not has_template:
        return ""
    return AdapterTokenizer(None, has_tokenizer, has_template, True).label


def adapter_tokenizer(folder: Path, base: Any, vocab_size: int) -> AdapterTokenizer | None:
    """The folder's tokenizer (or the base's with the folder's ``chat_template.jinja``) when it
    differs from ``base``; None when the folder has neither or they equal the base's.

    AdapterError when the files cannot be read or the tokenizer has more tokens than the
    adapter's vocabulary (``vocab_size``: the base's, or its resized embeddings').
    """
    template_path = folder / TEMPLATE_FILE
    has_tokenizer = any((folder / name).is_file() for name in TOKENIZER_FILES)
    if not has_tokenizer and not template_path.is_file():
        return None
    try:
        if has_tokenizer:
            for name in (*TOKENIZER_FILES, "tokenizer_config.json", "special_tokens_map.json"):
                if (folder / name).exists():
                    refuse_unless_regular(folder / name)
            tokenizer = load_tokenizer(folder)
        else:
            if base is None:
                return None  # a template without any tokenizer to render it with
            tokenizer = copy.deepcopy(base)
            refuse_unless_regular(template_path)
            if template_path.stat().st_size > MAX_TEMPLATE_BYTES:
                raise AdapterError(f"{template_path} is larger than {MAX_TEMPLATE_BYTES >> 20} MiB")
            tokenizer.chat_template = template_path.read_text()
    except AdapterError:
        raise
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
