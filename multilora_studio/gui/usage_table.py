"""The Monitor's endpoint usage: requests, hot/cold split, tokens, latency, engine time and cost
by tenant (API key name) and model, from the server's usage ledger (``server/usage.py``)."""

from __future__ import annotations

import time
from pathlib import Path

from PySide6.QtWidgets import (
    QDoubleSpinBox,
    QFileDialog,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from multilora_studio.gui.preferences import Preferences
from multilora_studio.gui.widgets import fill_rows, format_ms, read_only_table
from multilora_studio.server.usage import UsageLedger, UsageRow, rows_csv

COLUMNS = (
    "Tenant",
    "Model",
    "Requests",
    "Errors",
    "Hot / cold",
    "Cold wait",
    "Prompt tokens",
    "Generated tokens",
    "TTFT p50 / p95",
    "Cold TTFT p95",
    "Engine seconds",
    "Cost",
)
PRICE_PREF = "monitor/price_per_gpu_hour"
REFRESH_S = 1.0  # the ledger is summarised at most this often


class UsageTable(QGroupBox):
    """Refreshed by ``refresh`` (the Monitor's tick) while visible, at most every ``REFRESH_S``."""

    def __init__(self, usage: UsageLedger, prefs: Preferences, parent: QWidget | None = None) -> None:
        super().__init__("Endpoint usage by tenant (API key) and model", parent)
        self.usage = usage
        self.prefs = prefs
        self.rows: list[UsageRow] = []
        self._refreshed = 0.0
        self._version = -1  # the ledger's version last shown
        self.price = QDoubleSpinBox(minimum=0.0, maximum=10_000.0, decimals=2, singleStep=0.1)
        self.price.setPrefix("$")
        self.price.setSuffix(" per GPU-hour")
        self.price.setValue(float(prefs.get(PRICE_PREF, 2.0)))
        self.price.valueChanged.connect(self._price_changed)
        self.export_button = QPushButton("Export CSV…")
        self.export_button.clicked.connect(self._export_dialog)
        self.summary = QLabel("no requests through the endpoint yet")
        self.table = read_only_table(COLUMNS, 90, 200)
        top = QHBoxLayout()
        top.addWidget(self.summary, 1)
        top.addWidget(QLabel("Price"))
        top.addWidget(self.price)
        top.addWidget(self.export_button)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.table)

    def refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and (now - self._refreshed < REFRESH_S or self.usage.version == self._version):
            return  # summarising up to 100,000 records is only worth it when some were added
        self._refreshed, self._version = now, self.usage.version
        self.rows = self.usage.rows()
        self._fill()

    def _fill(self) -> None:
        price = self.price.value()
        fill_rows(
            self.table,
            [
                (
                    row.tenant,
                    row.model,
                    str(row.requests),
                    str(row.errors),
                    f"{row.requests - row.cold_requests} / {row.cold_requests}",
                    format_ms(row.cold_wait_s) if row.cold_requests else "-",
                    str(row.prompt_tokens),
                    str(row.completion_tokens),
                    f"{format_ms(row.ttft_p50_s)} / {format_ms(row.ttft_p95_s)}",
                    format_ms(row.cold_ttft_p95_s),
                    f"{row.engine_seconds:.3f}",
                    f"${row.cost(price):.4f}",
                )
                for row in self.rows
            ],
        )
        if self.rows:
            seconds = sum(row.engine_seconds for row in self.rows)
            requests = sum(row.requests for row in self.rows)
            cold = sum(row.cold_requests for row in self.rows)
            self.summary.setText(
                f"{requests} requests ({cold} cold), {seconds:.2f} engine seconds, "
                f"${sum(row.cost(price) for row in self.rows):.4f} at ${price:.2f} per GPU-hour"
            )

    def export(self, path: str | Path) -> Path:
        """Write the usage as CSV (the ledger's current rows) to ``path``."""
        path = Path(path)
        path.write_text(rows_csv(self.usage.rows()), encoding="utf-8")
        return path

    def _export_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export usage", "usage.csv", "CSV (*.csv)")
        if path:
            try:
                self.export(path)
            except OSError as error:
                self.summary.setText(f"Could not write {path}: {error.strerror or error}")

    def _price_changed(self, value: float) -> None:
        self.prefs.set(PRICE_PREF, value)
        self._fill()
