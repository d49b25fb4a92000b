"""Spawned child processes that do not re-run the parent's main script."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_main_lock = threading.Lock()


@contextmanager
def main_module_hidden() -> Iterator[None]:
    """Spawn children that do not import the parent's ``__main__``.

    A spawned child normally re-runs the parent's main script (as ``__mp_main__``) before
    its first task. Our children need nothing from it, and a user's script without an
    ``if __name__ == "__main__"`` guard would build a second engine in every child (a script
    read from stdin cannot be re-run at all). Children are started synchronously inside the
    block, so hiding the main module's file and spec meanwhile is enough.
    """
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    missing = object()
    with _main_lock:
        saved = {name: getattr(main, name, missing) for name in ("__file__", "__spec__")}
        main.__spec__ = None
        if saved["__file__"] is not missing:
            del main.__file__
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is not missing:
                    setattr(main, name, value)
