"""Monitor view: GPU slots and the CPU tier (of each engine replica), disk counts, counters, the
endpoint's usage by tenant, and live plots from the metrics snapshot."""

from __future__ import annotations

import math
import time
from collections import deque

import psutil
import pyqtgraph as pg
from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import (
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from multilora_studio.deploy import replicas_of
from multilora_studio.engine import EngineMetrics
from multilora_studio.gui.advice_panel import AdvicePanel
from multilora_studio.gui.engine_host import EngineHost
from multilora_studio.gui.preferences import Preferences
from multilora_studio.gui.replica_panel import ReplicaPanel, replica_title
from multilora_studio.gui.theme import plot_background, plot_foreground
from multilora_studio.gui.usage_table import UsageTable
from multilora_studio.gui.widgets import format_bytes, format_ms
from multilora_studio.server.usage import UsageLedger

HISTORY_S = 120.0
SERIES = (
    "tokens_per_second",
    "batch_size",
    "distinct_adapters",
    "gpu_hit_rate",
    "cpu_hit_rate",
    "p50",
    "p95",
)
PLOTS = (  # title, unit, series and pen colors
    ("Tokens / s", "tok/s", (("tokens_per_second", "#1e88e5"),)),
    (
        "Batch size and distinct adapters per step",
        "",
        (("batch_size", "#43a047"), ("distinct_adapters", "#fb8c00")),
    ),
    ("Hit rate (GPU slots, CPU tier)", "%", (("gpu_hit_rate", "#8e24aa"), ("cpu_hit_rate", "#00897b"))),
    ("Cold-load latency p50 / p95", "ms", (("p50", "#6d4c41"), ("p95", "#e53935"))),
)


def hit_rate(hits: int, misses: int) -> float:
    """Percent of lookups that hit (NaN before the first lookup)."""
    total = hits + misses
    return math.nan if total == 0 else 100.0 * hits / total


class MonitorView(QWidget):
    """Fed by ``update_metrics`` (the window's timer, ~5 Hz); plots redraw only while visible."""

    def __init__(
        self, host: EngineHost, usage: UsageLedger, prefs: Preferences, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.host = host
        self.usage = UsageTable(usage, prefs)
        self.advice = AdvicePanel(usage, host)
        self.process = psutil.Process()
        self.times: deque[float] = deque()
        self.history: dict[str, deque[float]] = {name: deque() for name in SERIES}
        self.last: EngineMetrics | None = None
        self.panels: list[ReplicaPanel] = []  # one per engine replica
        panels = QWidget()
        self.panels_layout = QVBoxLayout(panels)
        self.panels_layout.setContentsMargins(0, 0, 0, 0)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(panels)
        scroll.setMinimumHeight(240)
        scroll.setMaximumHeight(380)  # about two replicas' panels; more scroll
        self.counts = QLabel()
        self.counts.setWordWrap(True)
        self.stats = QLabel("waiting for the engine…")
        self.stats.setWordWrap(True)
        self.stats.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)

        stats_box = QGroupBox("Engine")
        QVBoxLayout(stats_box).addWidget(self.stats)
        row = QHBoxLayout()
        row.addWidget(self.counts, 1)
        row.addWidget(stats_box, 1)

        self.curves: dict[str, pg.PlotDataItem] = {}
        self.plots: list[pg.PlotWidget] = []
        plots = QGridLayout()
        for index, (title, unit, series) in enumerate(PLOTS):
            plot = pg.PlotWidget(title=title)
            plot.setMinimumHeight(140)
            plot.showGrid(x=True, y=True, alpha=0.2)
            plot.setLabel("bottom", "seconds ago")
            if unit:
                plot.setLabel("left", unit)
            plot.setMouseEnabled(x=False, y=False)
            plot.hideButtons()
            if len(series) > 1:
                plot.addLegend(offset=(-4, 4))
            for name, color in series:
                self.curves[name] = plot.plot(
                    [], [], pen=pg.mkPen(color, width=2), name=name.replace("_", " ")
                )
            self.plots.append(plot)
            plots.addWidget(plot, index // 2, index % 2)

        self._style_plots()
        content = QWidget()
        layout = QVBoxLayout(content)
        layout.addWidget(scroll)
        layout.addLayout(row)
        layout.addWidget(self.usage)
        layout.addWidget(self.advice)
        layout.addLayout(plots, 1)
        page = QScrollArea()  # the whole view scrolls in a small window
        page.setWidgetResizable(True)
        page.setFrameShape(QScrollArea.Shape.NoFrame)
        page.setWidget(content)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(page)

    def changeEvent(self, event: QEvent) -> None:
        if event.type() == QEvent.Type.PaletteChange:  # the OS switched light/dark
            self._style_plots()
        super().changeEvent(event)

    def _style_plots(self) -> None:
        background, foreground = plot_background(self.palette()), plot_foreground(self.palette())
        for plot in self.plots:
            plot.setBackground(background)
            plot.setTitle(plot.plotItem.titleLabel.text, color=foreground)
            for side in ("left", "bottom"):
                axis = plot.getAxis(side)
                axis.setPen(foreground)
                axis.setTextPen(foreground)
            legend = plot.plotItem.legend
            if legend is not None:
                legend.setLabelTextColor(foreground)
                for _sample, label in legend.items:
                    label.setText(label.text, color=foreground)

    def update_metrics(self, metrics: EngineMetrics | None) -> None:
        """Record a snapshot and refresh what is visible (GUI thread)."""
        if metrics is None:
            self.stats.setText("waiting for the engine…" if self.host.state == "loading" else "no engine")
            self._show_replicas([("0", None)])
            return
        self.last = metrics
        now = time.monotonic()
        values = {
            "tokens_per_second": metrics.tokens_per_second if metrics.state == "running" else 0.0,
            "batch_size": float(metrics.batch_size if metrics.running else 0),
            "distinct_adapters": float(metrics.distinct_adapters if metrics.running else 0),
            "gpu_hit_rate": hit_rate(metrics.gpu_hits, metrics.gpu_misses),
            "cpu_hit_rate": hit_rate(metrics.cpu_hits, metrics.cpu_misses),
            "p50": math.nan if metrics.cold_load_p50_s is None else metrics.cold_load_p50_s * 1000,
            "p95": math.nan if metrics.cold_load_p95_s is None else metrics.cold_load_p95_s * 1000,
        }
        self.times.append(now)
        for name, value in values.items():
            self.history[name].append(value)
        while self.times and now - self.times[0] > HISTORY_S:
            self.times.popleft()
            for series in self.history.values():
                series.popleft()
        if self.isVisible():
            self._redraw(now)
        engine = self.host.engine
        replicas = replicas_of(engine) if engine is not None else []
        if len(replicas) > 1:
            self._show_replicas([(label, replica.metrics()) for label, replica in replicas])
        else:
            self._show_replicas([("0", metrics)])
        self._show_tiers(metrics)
        self._show_stats(metrics, values)
        if self.isVisible():
            self.usage.refresh()

    def series(self, name: str) -> list[float]:
        return list(self.history[name])

    def _redraw(self, now: float) -> None:
        ages = [t - now for t in self.times]
        for name, curve in self.curves.items():
            curve.setData(ages, list(self.history[name]), connect="finite")

    def _show_replicas(self, snaps: list[tuple[str, EngineMetrics | None]]) -> None:
        """One panel per replica (label, snapshot), made or dropped as the count changes."""
        while len(self.panels) < len(snaps):
            panel = ReplicaPanel()
            self.panels_layout.addWidget(panel)
            self.panels.append(panel)
        while len(self.panels) > len(snaps):
            self.panels.pop().deleteLater()
        for panel, (label, snap) in zip(self.panels, snaps, strict=True):
            panel.show_metrics(replica_title(label, snap, len(snaps)), snap)

    def _show_tiers(self, metrics: EngineMetrics) -> None:
        """The served adapters by where they are (a replica set's: on any replica)."""
        names = list(metrics.cpu_adapters)
        engine = self.host.engine
        served = {info.name for info in engine.list_adapters()} if engine is not None else set()
        on_gpu = {s.adapter for s in metrics.slots if s.adapter is not None}
        disk_only = served - on_gpu - set(names)
        cpu_only = set(names) - on_gpu
        self.counts.setText(
            f"{len(served)} adapters served: {len(on_gpu)} in GPU slots, {len(cpu_only)} only in CPU RAM, "
            f"{len(disk_only)} only on disk; {len(self.host.skipped)} in the library not served"
        )

    def _show_stats(self, metrics: EngineMetrics, values: dict[str, float]) -> None:
        used = metrics.kv_blocks_total - metrics.kv_blocks_free
        rss = self.process.memory_info().rss

        def percent(value: float) -> str:
            return "-" if math.isnan(value) else f"{value:.0f}%"

        runs_out = metrics.pinned_blocks_exhausted
        exhausted = f" · pinned host blocks ran out {runs_out}x" if runs_out else ""
        compiles = metrics.kernel_compiles
        stalls = (
            f" · <b>{compiles} kernel compiles while serving ({metrics.kernel_compile_s:.1f} s of stalls)</b>"
            if compiles
            else ""
        )
        lines = [
            f"state: <b>{metrics.state}</b> on {metrics.device} · steps {metrics.steps}",
            f"requests: {metrics.running} running, {metrics.waiting} waiting · "
            f"preemptions {metrics.preemptions}{stalls}",
            f"tokens/s: <b>{values['tokens_per_second']:.1f}</b> · last step: {metrics.batch_size} seqs, "
            f"{metrics.batch_tokens} tokens, {metrics.distinct_adapters} distinct adapters",
            f"GPU slot hits {metrics.gpu_hits} / misses {metrics.gpu_misses} "
            f"({percent(values['gpu_hit_rate'])}) · CPU tier hits {metrics.cpu_hits} / misses "
            f"{metrics.cpu_misses} ({percent(values['cpu_hit_rate'])})",
            f"cold load (disk to host) p50 {format_ms(metrics.cold_load_p50_s)} · p95 "
            f"{format_ms(metrics.cold_load_p95_s)} · slot upload p50 {format_ms(metrics.upload_p50_s)} · "
            f"p95 {format_ms(metrics.upload_p95_s)}"
            f" · loader {metrics.adapter_loader} x{metrics.adapter_load_workers}{exhausted}",
            f"KV cache: {used} / {metrics.kv_blocks_total} blocks used · token tables "
            f"{metrics.token_tables} / {metrics.token_tables_max} adapters, "
            f"{format_bytes(metrics.token_table_bytes)} / {format_bytes(metrics.token_table_budget_bytes)}",
            f"device memory {format_bytes(metrics.device_memory_bytes)} · host RSS {format_bytes(rss)}",
        ]
        self.stats.setText("<br>".join(lines))
