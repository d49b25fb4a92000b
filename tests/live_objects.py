"""Count the Engine objects a process still holds, also while a running engine has frozen the heap.

A started engine moves the objects alive at its start out of the collector's reach
(``gc.freeze``), and ``gc.get_objects()`` does not list frozen objects; the count lets them back,
collects, counts, and freezes what is left again.
"""

from __future__ import annotations

import gc

from multilora_studio.engine import Engine


def live_engines() -> list[Engine]:
    frozen = gc.get_freeze_count() > 0
    gc.unfreeze()
    gc.collect()
    engines = [item for item in gc.get_objects() if isinstance(item, Engine)]
    if frozen:
        gc.freeze()
    return engines
