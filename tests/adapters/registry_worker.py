"""A separate process writing to a shared library (run by test_registry_concurrency.py).

Usage: ``python -m tests.adapters.registry_worker ROOT BASE_JSON LABEL SOURCE...``: imports every
SOURCE folder as ``LABEL-<i>``, then tries the shared name ``contested``, then pins and touches
its own adapters; prints one JSON line with what happened.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from multilora_studio.adapters.base_model import BaseModelRef
from multilora_studio.adapters.registry import LibraryError, Registry


def main(root: str, base_json: str, label: str, *sources: str) -> None:
    data = json.loads(base_json)
    base = BaseModelRef(
        data["name"], data["digest"], data["num_layers"], data["vocab_size"],
        {k: tuple(v) for k, v in data["shapes"].items()}, data["hidden_size"], data["tied_embeddings"],
    )  # fmt: skip
    registry = Registry(Path(root))
    mine = [registry.import_folder(Path(s), base, name=f"{label}-{i}").name for i, s in enumerate(sources)]
    try:
        registry.import_folder(Path(sources[0]), base, name="contested")
        won = True
    except LibraryError:
        won = False
    for name in mine:
        registry.set_pinned(name)
        registry.touch(name)
    print(json.dumps({"imported": mine, "won": won}))


if __name__ == "__main__":
    main(*sys.argv[1:])
