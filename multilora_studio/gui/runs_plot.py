"""The Runs view's plot: the mean score per checkpoint with its spread, the best marked, and the
training and evaluation losses on their own axis; a click near a step emits ``stepClicked``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Signal
from PySide6.QtWidgets import QVBoxLayout, QWidget

from multilora_studio.gui.workflows.runs_board import Curves

SCORE_COLOR, LOSS_COLOR, EVAL_LOSS_COLOR, BEST_COLOR = "#2b7bb9", "#c0504d", "#e49b2f", "#3a9d3a"


class RunsPlot(QWidget):
    """Score vs step above, losses vs step below (the same steps)."""

    stepClicked = Signal(float)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.scores = pg.PlotWidget(title="Mean score per checkpoint (± spread)")
        self.losses = pg.PlotWidget(title="Loss")
        for plot in (self.scores, self.losses):
            plot.showGrid(x=True, y=True, alpha=0.2)
            plot.setLabel("bottom", "step")
            plot.hideButtons()
            plot.setMinimumHeight(150)
        self.losses.setXLink(self.scores)
        self.losses.addLegend(offset=(-4, 4))
        self.score_curve = self.scores.plot(
            [], [], pen=pg.mkPen(SCORE_COLOR, width=2), symbol="o", symbolBrush=SCORE_COLOR, symbolSize=7
        )
        self.error_bars = pg.ErrorBarItem(
            x=np.zeros(0), y=np.zeros(0), height=np.zeros(0), pen=pg.mkPen(SCORE_COLOR)
        )
        self.scores.addItem(self.error_bars)
        self.best_marker = self.scores.plot(
            [], [], pen=None, symbol="star", symbolBrush=BEST_COLOR, symbolSize=18, name="best"
        )
        self.loss_curve = self.losses.plot([], [], pen=pg.mkPen(LOSS_COLOR, width=2), name="training loss")
        self.eval_loss_curve = self.losses.plot(
            [], [], pen=pg.mkPen(EVAL_LOSS_COLOR, width=2), symbol="t", symbolBrush=EVAL_LOSS_COLOR,
            name="evaluation loss",
        )  # fmt: skip
        for plot in (self.scores, self.losses):
            plot.scene().sigMouseClicked.connect(lambda event, p=plot: self._clicked(p, event))
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.scores, 3)
        layout.addWidget(self.losses, 2)

    def show_curves(self, curves: Curves, best_step: float | None, best_mean: float | None) -> None:
        self.scores.setLabel("left", curves.metric or "score")
        self.score_curve.setData(curves.score_steps, curves.scores)
        self.error_bars.setData(  # numpy arrays: the item divides them
            x=np.asarray(curves.score_steps, dtype=float),
            y=np.asarray(curves.scores, dtype=float),
            height=2 * np.asarray(curves.spreads, dtype=float),
        )
        if best_step is not None and best_mean is not None:
            self.best_marker.setData([best_step], [best_mean])
        else:
            self.best_marker.setData([], [])
        self.loss_curve.setData(curves.loss_steps, curves.losses)
        self.eval_loss_curve.setData(curves.eval_loss_steps, curves.eval_losses)

    def _clicked(self, plot: pg.PlotWidget, event: Any) -> None:  # pyqtgraph's MouseClickEvent
        point = plot.plotItem.vb.mapSceneToView(event.scenePos())
        self.stepClicked.emit(float(point.x()))
