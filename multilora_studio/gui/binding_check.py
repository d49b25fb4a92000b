"""Detect a Qt binding that loses references to ``None`` (it aborts the process after ~100k Qt calls).

PySide6-Essentials / shiboken6 6.12.0 on Python 3.10/3.11 drops one reference to ``None`` on
every Qt call that returns nothing; the interpreter aborts with ``none_dealloc`` once repaints
have used up the references. Python 3.12+ makes ``None`` immortal, so it cannot happen there.
The project's dependencies exclude those releases; this check catches a binding installed by
hand or a future release with the same defect.
"""

from __future__ import annotations

import logging
import sys

from PySide6.QtCore import QObject

from multilora_studio.util import window_requirement

log = logging.getLogger(__name__)

PROBE_CALLS = 500


def none_references_lost(calls: int = PROBE_CALLS) -> int:
    """References to ``None`` lost over ``calls`` Qt calls that return nothing (0 for a sound binding)."""
    probe = QObject()
    before = sys.getrefcount(None)
    for index in range(calls):
        probe.setObjectName("binding-probe" if index % 2 else "binding-probe-")
    return before - sys.getrefcount(None)


def binding_problem() -> str | None:
    """A message naming the defect and the fix when the installed binding leaks, else None."""
    if sys.version_info >= (3, 12):
        return None
    lost = none_references_lost()
    if lost < PROBE_CALLS // 2:
        return None
    import PySide6

    return (
        f"PySide6 {PySide6.__version__} on Python {sys.version_info.major}.{sys.version_info.minor} "
        f"loses a reference to None on every Qt call ({lost} of {PROBE_CALLS}) and would abort the "
        f"window within minutes; install a sound release: pip install '{window_requirement()}' "
        "(or run on Python 3.12 or newer)"
    )
