"""A process that races other processes over one library until a deadline (test_library_races.py).

Usage: ``python -m tests.security.library_racer ROOT GATE ROLE SECONDS NAME [BASE_JSON SOURCE]``;
it prints ``ready`` once its imports are done, waits for the file GATE, then, for SECONDS:

- ``archive``: archives NAME and restores it, over and over (two of them: two archives of one
  adapter at once, a restore meeting an archive);
- ``open``: opens the library (which sweeps what crashed writes left) and lists it, over and
  over, as the window, ``serve`` and every ``adapters`` command do when they start;
- ``churn``: imports SOURCE as ``NAME-<pid>-<i>`` and removes it again (BASE_JSON: the
  BaseModelRef's fields).

A refusal the race makes expected ("archived already", "not archived", "meanwhile") is
counted; anything else ends the process with its traceback. Prints one JSON line of counts
at the end.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

from multilora_studio.adapters.base_model import BaseModelRef
from multilora_studio.adapters.registry import LibraryError, Registry


def attempt(counts: Counter, action: str, run) -> None:
    try:
        run()
    except LibraryError:
        counts[f"{action} refused"] += 1
    else:
        counts[action] += 1


def main(
    root: str, gate: str, role: str, seconds: str, name: str, base_json: str = "", source: str = ""
) -> None:
    counts: Counter = Counter()
    registry = Registry(Path(root))
    base = None
    if base_json:
        from multilora_studio.adapters import peft_adapter  # noqa: F401  # torch, before the race

        fields = json.loads(base_json)
        base = BaseModelRef(**{**fields, "shapes": {k: tuple(v) for k, v in fields["shapes"].items()}})
    print("ready", flush=True)
    while not os.path.exists(gate):
        time.sleep(0.01)
    deadline = time.monotonic() + float(seconds)
    while time.monotonic() < deadline:
        if role == "archive":
            attempt(counts, "archived", lambda: registry.archive(name, "race"))
            attempt(counts, "restored", lambda: registry.restore(name, "race"))
        elif role == "open":
            Registry(Path(root)).list_adapters()
            counts["opened"] += 1
        elif role == "churn":
            own = f"{name}-{os.getpid()}-{counts['imported']}"
            registry.import_folder(Path(source), base, name=own)  # type: ignore[arg-type]
            counts["imported"] += 1
            registry.remove(own)
            counts["removed"] += 1
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
