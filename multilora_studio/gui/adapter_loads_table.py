"""The Monitor's cold start by adapter: each adapter's reads from disk into host RAM and uploads
into a GPU slot, counted, with p50 / p95 (``EngineMetrics.adapter_loads`` of every loaded base)."""

from __future__ import annotations

import operator

from PySide6.QtWidgets import QGroupBox, QLabel, QVBoxLayout, QWidget

from multilora_studio.adapters.load_latency import ADAPTER_WINDOW
from multilora_studio.gui.base_states import BaseState
from multilora_studio.gui.widgets import fill_rows, format_ms, read_only_table
from multilora_studio.server.metrics import most_loaded

COLUMNS = ("Base", "Adapter", "Disk → host loads", "p50 / p95", "Host → GPU uploads", "p50 / p95")
MAX_ROWS = 100  # the adapters with the most loads


class AdapterLoadsTable(QGroupBox):
    """Shown by ``show_bases`` (the Monitor's tick); rows change only when the figures do."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Cold start by adapter", parent)
        self.rows: list[tuple[str, ...]] = []
        self._figures: list[object] = []  # the bases' adapter_loads last shown (unchanged: the same)
        self.summary = QLabel("no adapter loaded yet")
        self.table = read_only_table(COLUMNS, 90, 200)
        layout = QVBoxLayout(self)
        layout.addWidget(self.summary)
        layout.addWidget(self.table)

    def show_bases(self, bases: list[BaseState]) -> None:
        figures = [base.metrics.adapter_loads for base in bases if base.metrics]
        if len(figures) == len(self._figures) and all(map(operator.is_, figures, self._figures)):
            return  # no load since: a snapshot keeps its tuple (thousands of adapters, 5 times a second)
        self._figures = list(figures)
        loads = [(base.name, a) for base in bases if base.metrics for a in base.metrics.adapter_loads]
        shown = {id(a) for a in most_loaded([a for _, a in loads], MAX_ROWS)}
        rows: list[tuple[str, ...]] = [
            (
                base,
                a.adapter,
                str(a.disk_to_host.loads),
                f"{format_ms(a.disk_to_host.p50_s)} / {format_ms(a.disk_to_host.p95_s)}",
                str(a.host_to_gpu.loads),
                f"{format_ms(a.host_to_gpu.p50_s)} / {format_ms(a.host_to_gpu.p95_s)}",
            )
            for base, a in loads
            if id(a) in shown
        ]
        if rows == self.rows:
            return
        self.rows = rows
        fill_rows(self.table, rows)
        more = f" (the {MAX_ROWS} with the most loads shown)" if len(loads) > len(rows) else ""
        self.summary.setText(
            f"{len(loads)} adapters loaded since their engine started{more}; "
            f"quantiles of each adapter's last {ADAPTER_WINDOW} loads"
        )
