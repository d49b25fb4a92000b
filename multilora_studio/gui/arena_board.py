"""The Arena's leaderboard: ratings with 95 % intervals, win rates and votes per contender, the
pairwise win matrix, which contenders are not yet separable, and how often each judge agreed with
people."""

from __future__ import annotations

from PySide6.QtWidgets import QHeaderView, QLabel, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget

from multilora_studio.arena import Leaderboard
from multilora_studio.arena.table import COLUMNS, standing_cells, summary


class ArenaBoard(QWidget):
    """See the module docstring; ``show_board`` fills it."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.summary = QLabel("No votes yet.")
        self.judges = QLabel()
        self.judges.setWordWrap(True)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.matrix = QTableWidget(0, 0)
        self.matrix.setToolTip("Row's score against the column: wins plus half the ties, over games")
        for table in (self.table, self.matrix):
            table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
            table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.summary)
        layout.addWidget(self.table, 3)
        layout.addWidget(self.judges)
        layout.addWidget(QLabel("<b>Pairwise wins</b>"))
        layout.addWidget(self.matrix, 2)

    def show_board(self, board: Leaderboard, agreements: list[str]) -> None:
        """Fill the tables from ``board`` (people's votes); ``agreements``: a line per judge."""
        self.summary.setText(summary(board))
        self.judges.setText("\n".join(agreements) or "No judge has voted on these rounds.")
        self.table.setRowCount(len(board.standings))
        for row, s in enumerate(board.standings):
            for column, text in enumerate(standing_cells(board, s)):
                self.table.setItem(row, column, QTableWidgetItem(text))
        names = board.names
        self.matrix.setRowCount(len(names))
        self.matrix.setColumnCount(len(names))
        self.matrix.setHorizontalHeaderLabels(names)
        self.matrix.setVerticalHeaderLabels(names)
        for i, scores in enumerate(board.matrix):
            for j, score in enumerate(scores):
                text = "" if score is None else f"{score:.0%} of {board.games[i][j]}"
                self.matrix.setItem(i, j, QTableWidgetItem(text))
