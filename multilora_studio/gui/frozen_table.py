"""A table whose first column stays in place when the others scroll sideways."""

from __future__ import annotations

from PySide6.QtCore import QAbstractItemModel, QItemSelectionModel, Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableView, QWidget


class FrozenFirstColumnTable(QTableView):
    """QTableView with a second view over its first column, laid on top at the left edge.

    Both views share the model and the selection; the overlay scrolls vertically with the table
    and keeps the first column's width, so a row's name stays readable however far the other
    columns are scrolled (Qt's frozen-column pattern).
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.frozen = QTableView(self)
        self.frozen.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.frozen.verticalHeader().hide()
        self.frozen.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
        self.frozen.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.frozen.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.frozen.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.setHorizontalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.frozen.setStyleSheet("QTableView { border: none; }")
        self.viewport().stackUnder(self.frozen)
        self.horizontalHeader().sectionResized.connect(self._section_resized)
        self.verticalHeader().sectionResized.connect(self._row_resized)
        self.frozen.verticalScrollBar().valueChanged.connect(self.verticalScrollBar().setValue)
        self.verticalScrollBar().valueChanged.connect(self.frozen.verticalScrollBar().setValue)

    def setModel(self, model: QAbstractItemModel | None) -> None:
        super().setModel(model)
        self.frozen.setModel(model)
        self.frozen.setSelectionModel(self.selectionModel())
        self._show_first_column_only()
        self._place()

    def setSelectionModel(self, selection: QItemSelectionModel) -> None:
        super().setSelectionModel(selection)
        if self.frozen.model() is selection.model():  # setModel makes one before the overlay has the model
            self.frozen.setSelectionModel(selection)

    def setSortingEnabled(self, enable: bool) -> None:
        super().setSortingEnabled(enable)
        self.frozen.setSortingEnabled(enable)

    def setSelectionBehavior(self, behavior: QAbstractItemView.SelectionBehavior) -> None:
        super().setSelectionBehavior(behavior)
        self.frozen.setSelectionBehavior(behavior)

    def setAlternatingRowColors(self, enable: bool) -> None:
        super().setAlternatingRowColors(enable)
        self.frozen.setAlternatingRowColors(enable)

    def setTextElideMode(self, mode: Qt.TextElideMode) -> None:
        super().setTextElideMode(mode)
        self.frozen.setTextElideMode(mode)

    def frozen_width(self) -> int:
        """Pixels the overlay covers: the first column's width."""
        return self.columnWidth(0)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._place()

    def updateGeometries(self) -> None:
        super().updateGeometries()
        self._place()

    def _show_first_column_only(self) -> None:
        model = self.model()
        if model is None:
            return
        for column in range(1, model.columnCount()):
            self.frozen.setColumnHidden(column, True)

    def _section_resized(self, index: int, _old: int, _size: int) -> None:
        if index == 0:
            self._place()

    def _row_resized(self, index: int, _old: int, size: int) -> None:
        self.frozen.setRowHeight(index, size)

    def _place(self) -> None:
        header = self.horizontalHeader()
        self.frozen.setColumnWidth(0, self.columnWidth(0))
        self.frozen.horizontalHeader().setFixedHeight(header.height())
        self.frozen.setGeometry(
            self.verticalHeader().width() + self.frameWidth(),
            self.frameWidth(),
            self.columnWidth(0),
            self.viewport().height() + header.height(),
        )
