"""The Library table's model: one row per library adapter, with where its weights are now."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from PySide6.QtCore import (
    QAbstractTableModel,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    QSortFilterProxyModel,
    Qt,
)

from multilora_studio.adapters.registry_schema import AdapterRecord
from multilora_studio.engine import EngineMetrics
from multilora_studio.gui.base_states import LOADED, PARKED, BaseState
from multilora_studio.gui.widgets import format_bytes, format_time

# Name first (it stays in place when the table scrolls sideways), then what changes while serving
COLUMNS = (
    "Name",
    "State",
    "Tier",
    "Pinned",
    "Rank",
    "Size",
    "Base",
    "Targets",
    "Source",
    "Aliases",
    "Last used",
)
TIER_COLUMN = COLUMNS.index("Tier")
SORTED_AS_IS: dict[str, Callable[[AdapterRecord], Any]] = {  # sort keys that need no cell text
    "Name": lambda record: record.name.casefold(),
    "Rank": lambda record: record.rank,
    "Size": lambda record: record.size_bytes,
    "Last used": lambda record: record.last_used or 0.0,
    "Pinned": lambda record: int(record.pinned),
}
DESCENDING = Qt.SortOrder.DescendingOrder
Index = QModelIndex | QPersistentModelIndex


def tiers_of(metrics: EngineMetrics | None, served: Iterable[str]) -> dict[str, str]:
    """'GPU slot N', 'CPU' or 'disk' for every adapter the engine serves."""
    tiers = dict.fromkeys(served, "disk")
    if metrics is None:
        return tiers
    for name in metrics.cpu_adapters:
        if name in tiers:
            tiers[name] = "CPU"
    for slot in metrics.slots:
        if slot.adapter in tiers:
            tiers[slot.adapter] = f"GPU slot {slot.slot}"
    return tiers


def tiers_of_bases(bases: Iterable[BaseState]) -> dict[str, str]:
    """``tiers_of`` each base's adapters; those of a parked base in CPU RAM or on disk, those of
    another base that is not loaded on disk."""
    tiers: dict[str, str] = {}
    for base in bases:
        if base.state == LOADED:
            tiers.update(tiers_of(base.metrics, base.adapters))
        elif base.state == PARKED:
            in_ram = set(base.metrics.cpu_adapters) if base.metrics is not None else set()
            tiers.update(
                {name: f"{'CPU' if name in in_ram else 'disk'} (base parked)" for name in base.adapters}
            )
        else:
            tiers.update(dict.fromkeys(base.adapters, f"disk (base {base.state})"))
    return tiers


def base_key(record: AdapterRecord) -> str:
    """What the Library's base filter groups by: the base weights' digest (the name when the
    digest is unknown)."""
    return record.base_digest or f"name:{record.base_name}"


class BaseFilterProxy(QSortFilterProxyModel):
    """The text filter over every column (``set_text``), and the rows of one base (``set_base``;
    None: all). Sorting is the source model's (``LibraryModel.sort``): this proxy keeps its
    order, so neither filtering nor sorting calls ``data`` for every row and column."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.base: str | None = None
        self.text = ""

    def set_base(self, key: str | None) -> None:
        if key != self.base:
            self.base = key
            self.invalidate()

    def set_text(self, text: str) -> None:
        self.text = text.casefold()
        self.invalidate()

    def sort(self, column: int, order: Qt.SortOrder = Qt.SortOrder.AscendingOrder) -> None:
        model = self.sourceModel()
        if isinstance(model, LibraryModel):
            model.sort(column, order)

    def filterAcceptsRow(self, source_row: int, source_parent: Index) -> bool:
        model = self.sourceModel()
        if not isinstance(model, LibraryModel):
            return True
        if self.base is not None and base_key(model.record(source_row)) != self.base:
            return False
        return model.matches(source_row, self.text)


def cells_of(record: AdapterRecord) -> tuple[str, ...]:
    """The row's text in ``COLUMNS`` order; the tier (which changes while serving) left empty."""
    values = {
        "Name": record.name,
        "State": record.state + (", warm" if record.warm else ""),
        "Aliases": ", ".join(record.aliases),
        "Source": ("Hub " if record.source_kind == "hub" else "") + record.source_label,
        "Base": record.base_name,
        "Rank": record.rank_label,
        "Targets": ", ".join(record.targets),
        "Size": format_bytes(record.size_bytes),
        "Tier": "",
        "Pinned": "yes" if record.pinned else "",
        "Last used": format_time(record.last_used),
    }
    return tuple(values[column] for column in COLUMNS)


def row_runs(rows: Iterable[int]) -> list[tuple[int, int]]:
    """``(first, last)`` of each run of consecutive rows, in order."""
    runs: list[tuple[int, int]] = []
    for row in sorted(rows):
        if runs and runs[-1][1] == row - 1:
            runs[-1] = (runs[-1][0], row)
        else:
            runs.append((row, row))
    return runs


class LibraryModel(QAbstractTableModel):
    """Rows are AdapterRecords, in the order of the last ``sort``; the tier column follows the
    engine's metrics snapshot.

    Built for libraries of thousands: a row's text is made once, when it is first shown or
    filtered; a refresh that keeps the same adapters redraws only the rows whose records
    changed, and a tier update only the rows whose tier changed.
    """

    def __init__(self) -> None:
        super().__init__()
        self.records: list[AdapterRecord] = []
        self.tiers: dict[str, str] = {}
        self.skipped: dict[str, str] = {}
        self.sort_column, self.sort_order = 0, Qt.SortOrder.AscendingOrder
        self._rows: dict[str, int] = {}  # name -> row
        self._cells: list[tuple[str, ...] | None] = []  # cells_of each row, made on first use
        self._texts: list[str | None] = []  # each row's cells casefolded, for the filter

    def set_records(self, records: list[AdapterRecord], skipped: dict[str, str]) -> bool:
        """Show ``records``: the rows of those whose records (or skip reasons) changed are
        redrawn in place when the library holds the same adapters, else the table is rebuilt
        (then returns True)."""
        if len(records) == len(self.records) and all(r.name in self._rows for r in records):
            changed = []
            for record in records:
                row = self._rows[record.name]
                if record != self.records[row] or skipped.get(record.name) != self.skipped.get(record.name):
                    self.records[row], self._cells[row], self._texts[row] = record, None, None
                    changed.append(row)
            self.skipped = dict(skipped)
            self._rows_changed(changed, 0, len(COLUMNS) - 1)
            return False
        self.beginResetModel()
        self.skipped = dict(skipped)
        self._arrange(list(records), [None] * len(records))
        self.endResetModel()
        return True

    def set_tiers(self, tiers: dict[str, str]) -> None:
        if tiers == self.tiers:
            return
        moved = {name for name in self.tiers.keys() | tiers.keys() if self.tiers.get(name) != tiers.get(name)}
        self.tiers = dict(tiers)
        self._rows_changed(
            [self._rows[name] for name in moved if name in self._rows], TIER_COLUMN, TIER_COLUMN
        )

    def tier(self, name: str) -> str:
        if name in self.skipped:
            return "not served"
        return self.tiers.get(name, "not served")

    def record(self, row: int) -> AdapterRecord:
        return self.records[row]

    def row_of(self, name: str) -> int | None:
        """The row of adapter ``name`` (None if it is not in the library)."""
        return self._rows.get(name)

    def matches(self, row: int, text: str) -> bool:
        """Whether ``text`` (casefolded) is in one of the row's cells ("" matches every row)."""
        if not text:
            return True
        cached = self._texts[row]
        if cached is None:
            cached = self._texts[row] = "\n".join(self._row_cells(row)).casefold()
        return text in cached or text in self.tier(self.records[row].name).casefold()

    def sort(self, column: int, order: Qt.SortOrder = Qt.SortOrder.AscendingOrder) -> None:
        """Order the rows by ``column`` (numbers by value, text case-insensitively); the order
        holds through refreshes that keep the same adapters."""
        self.sort_column, self.sort_order = column, order
        self.layoutAboutToBeChanged.emit()
        persistent = self.persistentIndexList()
        names = [self.records[index.row()].name for index in persistent]
        self._arrange(self.records, self._cells)
        moved = [
            self.index(self._rows[name], index.column())
            for name, index in zip(names, persistent, strict=True)
        ]
        self.changePersistentIndexList(persistent, moved)
        self.layoutChanged.emit()

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.records)

    def columnCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = 0) -> Any:
        if role == Qt.ItemDataRole.DisplayRole and orientation == Qt.Orientation.Horizontal:
            return COLUMNS[section]
        return None

    def data(self, index: Index, role: int = 0) -> Any:
        if not index.isValid():
            return None
        row, column = index.row(), index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return (
                self.tier(self.records[row].name) if column == TIER_COLUMN else self._row_cells(row)[column]
            )
        if role == Qt.ItemDataRole.ToolTipRole:
            record = self.records[row]
            if record.name in self.skipped:
                return f"Not served: {self.skipped[record.name]}"
            return str(record.path)
        return None

    def _row_cells(self, row: int) -> tuple[str, ...]:
        cells = self._cells[row]
        if cells is None:
            cells = self._cells[row] = cells_of(self.records[row])
        return cells

    def _arrange(self, records: list[AdapterRecord], cells: list[tuple[str, ...] | None]) -> None:
        """Hold ``records`` (with their cells, None where not made yet) in the sort order."""
        column = COLUMNS[self.sort_column]
        keys: list[Any]
        if column in SORTED_AS_IS:
            keys = [SORTED_AS_IS[column](record) for record in records]
        elif column == "Tier":
            keys = [self.tier(record.name).casefold() for record in records]
        else:  # a text column: every row's cells are needed now
            filled = [made or cells_of(record) for record, made in zip(records, cells, strict=True)]
            keys = [row_cells[self.sort_column].casefold() for row_cells in filled]
            cells = list(filled)
        order = sorted(range(len(records)), key=keys.__getitem__, reverse=self.sort_order == DESCENDING)
        self.records = [records[index] for index in order]
        self._cells = [cells[index] for index in order]
        self._texts = [None] * len(order)
        self._rows = {record.name: row for row, record in enumerate(self.records)}

    def _rows_changed(self, rows: list[int], first_column: int, last_column: int) -> None:
        for first, last in row_runs(rows):
            self.dataChanged.emit(self.index(first, first_column), self.index(last, last_column))
