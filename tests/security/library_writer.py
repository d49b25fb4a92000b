"""A process that writes the library without end, to be killed with SIGKILL (test_library_writes.py).

Usage: ``python -m tests.security.library_writer ROOT BASE_JSON SOURCE LABEL`` (BASE_JSON: the
BaseModelRef's fields, so the writer starts without the engine's imports). Round i imports
SOURCE as ``LABEL-w-i``, renames it, gives it an alias, pins it, archives and restores it,
registers SOURCE as the Hub snapshot ``org/LABEL-w-i``, removes the previous round's two
adapters, and prints each step as it starts, so the test can kill it in the middle of any of
them.
"""

from __future__ import annotations

import json
import sys
from itertools import count
from pathlib import Path

from multilora_studio.adapters.base_model import BaseModelRef
from multilora_studio.adapters.registry import Registry


def step(name: str) -> None:
    print(name, flush=True)


def main(root: str, base_json: str, source: str, label: str) -> None:
    registry = Registry(Path(root))
    fields = json.loads(base_json)
    base = BaseModelRef(**{**fields, "shapes": {k: tuple(v) for k, v in fields["shapes"].items()}})
    folder = Path(source)
    for i in count():
        name, hub = f"{label}-w-{i}", f"org/{label}-w-{i}"
        step("import")
        registry.import_folder(folder, base, name=name)
        step("rename")
        registry.rename(name, f"{label}-r-{i}")
        step("alias")
        registry.add_alias(f"{label}-r-{i}", f"{label}-a-{i}")
        step("pin")
        registry.set_pinned(f"{label}-a-{i}")
        step("archive")
        registry.archive(f"{label}-a-{i}")
        step("restore")
        registry.restore(f"{label}-a-{i}")
        step("register")
        registry.register_hub(folder, base, repo_id=hub, revision=f"{i:040x}", requested_revision=None)
        if i:
            step("remove")
            registry.remove(f"{label}-r-{i - 1}")
            registry.remove(f"org/{label}-w-{i - 1}")


if __name__ == "__main__":
    main(*sys.argv[1:])
