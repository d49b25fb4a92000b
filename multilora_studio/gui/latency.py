"""Measures how late the GUI thread's event loop runs a short timer (a stall shows as a late tick)."""

from __future__ import annotations

import time

from PySide6.QtCore import QObject, Qt, QTimer


class EventLoopProbe(QObject):
    """Fires every ``interval_ms`` and records how much later than asked each tick came."""

    def __init__(self, interval_ms: int = 10, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.interval_s = interval_ms / 1000
        self.delays_s: list[float] = []
        self._last = 0.0
        self._timer = QTimer(self)
        self._timer.setTimerType(Qt.TimerType.PreciseTimer)
        self._timer.setInterval(interval_ms)
        self._timer.timeout.connect(self._tick)

    def start(self) -> None:
        self.delays_s.clear()
        self._last = time.perf_counter()
        self._timer.start()

    def stop(self) -> None:
        self._timer.stop()

    def _tick(self) -> None:
        now = time.perf_counter()
        self.delays_s.append(max(0.0, now - self._last - self.interval_s))
        self._last = now

    @property
    def max_ms(self) -> float:
        return 1000 * max(self.delays_s, default=0.0)

    def percentile_ms(self, fraction: float) -> float:
        if not self.delays_s:
            return 0.0
        ordered = sorted(self.delays_s)
        return 1000 * ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]
