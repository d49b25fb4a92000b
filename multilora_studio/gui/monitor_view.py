"""Monitor view: each base model's state with its GPU slots and CPU tier (of each engine replica),
disk counts, counters, the endpoint's usage by tenant, cold start by adapter, and live plots from the
metrics snapshot."""

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

from multilora_studio.engine import EngineMetrics
from multilora_studio.gui.adapter_loads_table import AdapterLoadsTable
from multilora_studio.gui.advice_panel import AdvicePanel
from multilora_studio.gui.base_panel import BasePanel
from multilora_studio.gui.base_states import LOADED, BaseState
from multilora_studio.gui.engine_host import EngineHost
from multilora_studio.gui.preferences import Preferences
from multilora_studio.gui.replica_panel import ReplicaPanel
from multilora_studio.gui.theme import plot_background, plot_foreground
from multilora_studio.gui.usage_table import UsageTable
from multilora_studio.gui.widgets import format_bytes, format_ms, scroll_as_one_page
from multilora_studio.server.usage import UsageLedger

HISTORY_S = 120.0
SERIES = (
    "tokens_per_second",
    "batch_size",
    "distinct_adapters",
    "gpu_hit_rate",
    "cpu_hit_rate",
    "prefix_cache_hit_rate",
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
    (
        "Hit rate (GPU slots, CPU tier, prefix cache)",
        "%",
        (("gpu_hit_rate", "#8e24aa"), ("cpu_hit_rate", "#00897b"), ("prefix_cache_hit_rate", "#3949ab")),
    ),
    ("Cold-load latency p50 / p95", "ms", (("p50", "#6d4c41"), ("p95", "#e53935"))),
)
PANELS_MIN_HEIGHT, PANELS_MAX_HEIGHT = 240, 560  # a slot panel; all of them: about two, more scroll
BASE_TITLE_HEIGHT = 40  # a base's heading and note above its slot panels
NO_ENGINE = BaseState("", "", LOADED, None, (("0", None),), (), None, 0, None)  # an empty slot grid


def hit_rate(hits: int, misses: int) -> float:
    """Percent of lookups that hit (NaN before the first lookup)."""
    total = hits + misses
    return math.nan if total == 0 else 100.0 * hits / total


def prefix_cache_line(metrics: EngineMetrics, block_size: int) -> str:
    """The prefix cache's hit rate over the prompt tokens looked up, and its blocks (as tokens, and
    against the KV cache's blocks); "off" when the engine runs without it."""
    blocks = metrics.prefix_cache_blocks
    if blocks is None:
        return "prefix cache: off"
    rate = metrics.prefix_cache_hit_rate
    return (
        f"prefix cache: hit rate <b>{'-' if rate is None else f'{rate:.0%}'}</b> "
        f"({metrics.prefix_cache_hit_tokens} of {metrics.prefix_cache_queried_tokens} prompt tokens) · "
        f"{blocks} / {metrics.kv_blocks_total} KV blocks cached ({blocks * block_size} tokens)"
    )


class MonitorView(QWidget):
    """Fed by ``update_metrics`` (the window's timer, ~5 Hz); plots redraw only while visible.

    One panel per base model (``bases``); the counters and plots are of the snapshot given:
    the one base's, or the sum over the loaded bases (the window's ``poll_metrics``)."""

    def __init__(
        self, host: EngineHost, usage: UsageLedger, prefs: Preferences, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.host = host
        self.usage = UsageTable(usage, prefs)
        self.loads = AdapterLoadsTable()
        self.advice = AdvicePanel(usage, host)
        self.process = psutil.Process()
        self.times: deque[float] = deque()
        self.history: dict[str, deque[float]] = {name: deque() for name in SERIES}
        self.last: EngineMetrics | None = None
        self.bases: list[BasePanel] = []  # one per base model
        self.base_states: list[BaseState] = []
        self.block_size = NO_ENGINE.block_size  # tokens per KV block of the bases (alike: no window setting)
        self.counts = QLabel()
        self.counts.setWordWrap(True)
        self.stats = QLabel("waiting for the engine…")
        self.stats.setWordWrap(True)
        self.stats.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.stats_box = QGroupBox("Engine")
        QVBoxLayout(self.stats_box).addWidget(self.stats)
        row = QHBoxLayout()
        row.addWidget(self.counts, 1)
        row.addWidget(self.stats_box, 1)
        content = QWidget()
        layout = QVBoxLayout(content)
        layout.addWidget(self._panels_area())
        layout.addLayout(row)
        layout.addWidget(self.usage)
        layout.addWidget(self.loads)
        layout.addWidget(self.advice)
        layout.addLayout(self._plots(), 1)
        self._style_plots()
        scroll_as_one_page(self, content)

    def _panels_area(self) -> QScrollArea:
        """The base panels, one per base model, in a scroll area of bounded height."""
        panels = QWidget()
        self.panels_layout = QVBoxLayout(panels)
        self.panels_layout.setContentsMargins(0, 0, 0, 0)
        self.panels_scroll = scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(panels)
        scroll.setMinimumHeight(PANELS_MIN_HEIGHT)
        scroll.setMaximumHeight(PANELS_MAX_HEIGHT)
        return scroll

    def _plots(self) -> QGridLayout:
        """The live plots (``PLOTS``), two a row; ``curves`` holds each series' curve."""
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
        return plots

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

    @property
    def panels(self) -> list[ReplicaPanel]:
        """The slot panels shown: every loaded base's replicas, base after base."""
        return [panel for base in self.bases for panel in base.replicas]

    def update_metrics(self, metrics: EngineMetrics | None, bases: list[BaseState] | None = None) -> None:
        """Record a snapshot and refresh what is visible (GUI thread); ``bases``: the pool's
        bases now (None: keep the panels as they are)."""
        if bases is not None:
            self._show_bases(bases or [NO_ENGINE])
        if metrics is None:
            self.stats.setText("waiting for the engine…" if self.host.state == "loading" else "no engine")
            return
        self.last = metrics
        now = time.monotonic()
        prefix_rate = metrics.prefix_cache_hit_rate
        values = {
            "tokens_per_second": metrics.tokens_per_second if metrics.state == "running" else 0.0,
            "batch_size": float(metrics.batch_size if metrics.running else 0),
            "distinct_adapters": float(metrics.distinct_adapters if metrics.running else 0),
            "gpu_hit_rate": hit_rate(metrics.gpu_hits, metrics.gpu_misses),
            "cpu_hit_rate": hit_rate(metrics.cpu_hits, metrics.cpu_misses),
            "prefix_cache_hit_rate": math.nan if prefix_rate is None else 100.0 * prefix_rate,
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
        self._show_tiers()
        self._show_stats(metrics, values)
        if self.isVisible():
            self.usage.refresh()
            self.loads.show_bases(self.base_states)

    def series(self, name: str) -> list[float]:
        return list(self.history[name])

    def _redraw(self, now: float) -> None:
        ages = [t - now for t in self.times]
        for name, curve in self.curves.items():
            curve.setData(ages, list(self.history[name]), connect="finite")

    def _show_bases(self, bases: list[BaseState]) -> None:
        """One panel per base, made or dropped as the count changes."""
        self.base_states = [base for base in bases if base.name]
        self.block_size = bases[0].block_size
        while len(self.bases) < len(bases):
            panel = BasePanel()
            self.panels_layout.addWidget(panel)
            self.bases.append(panel)
        while len(self.bases) > len(bases):
            self.bases.pop().deleteLater()
        for panel, base in zip(self.bases, bases, strict=True):
            panel.show_base(base, len(bases))
        wanted = PANELS_MIN_HEIGHT * max(1, len(self.panels)) + BASE_TITLE_HEIGHT * (len(bases) - 1)
        self.panels_scroll.setMinimumHeight(min(PANELS_MAX_HEIGHT, wanted))
        loaded = sum(base.state == LOADED for base in self.base_states)
        several = len(bases) > 1
        self.stats_box.setTitle(f"Engines: the sum over {loaded} loaded bases" if several else "Engine")

    def _show_tiers(self) -> None:
        """The served adapters by where they are (on any base, on any replica)."""
        served = {name for base in self.base_states for name in base.adapters}
        snaps = [snap for base in self.base_states for _, snap in base.replicas if snap is not None]
        on_gpu = {s.adapter for snap in snaps for s in snap.slots if s.adapter is not None}
        cpu_only = {name for snap in snaps for name in snap.cpu_adapters} - on_gpu
        disk_only = served - on_gpu - cpu_only
        self.counts.setText(
            f"{len(served)} adapters served: {len(on_gpu)} in GPU slots, {len(cpu_only)} only in CPU RAM, "
            f"{len(disk_only)} only on disk; {len(self.host.skipped)} in the library not served · "
            f"CPU RAM tiers {sum(len(s.cpu_adapters) for s in snaps)} / {sum(s.cpu_capacity for s in snaps)} "
            f"adapters, {format_bytes(sum(s.cpu_bytes for s in snaps))}"
        )

    def _show_stats(self, metrics: EngineMetrics, values: dict[str, float]) -> None:
        used = metrics.kv_blocks_total - metrics.kv_blocks_free
        rss = self.process.memory_info().rss

        def percent(value: float) -> str:
            return "-" if math.isnan(value) else f"{value:.0f}%"

        runs_out = metrics.pinned_blocks_exhausted
        exhausted = f" · {runs_out} loads kept in pageable memory (staged for upload)" if runs_out else ""
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
            prefix_cache_line(metrics, self.block_size),
            f"device memory {format_bytes(metrics.device_memory_bytes)} · host RSS {format_bytes(rss)}",
        ]
        self.stats.setText("<br>".join(lines))
