"""The Library table's model: one row per library adapter, with where its weights are now."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt

from multilora_studio.adapters.registry_schema import AdapterRecord
from multilora_studio.engine import EngineMetrics
from multilora_studio.gui.base_states import LOADED, PARKED, BaseState
from multilora_studio.gui.widgets import format_bytes, format_time
from multilora_studio.gui.workflows.library_selection import base_key

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
DISPLAY = Qt.ItemDataRole.DisplayRole.value  # the roles data() answers, as the ints it gets
TOOL_TIP = Qt.ItemDataRole.ToolTipRole.value
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


@dataclass(frozen=True)
class LibraryRows:
    """The library as the table shows it, made where the library is read (a task thread, not
    the GUI thread: 10,000 rows take tens of ms): the records in the library's order, each
    row's ``cells_of`` and its filter text (the cells casefolded, one line each)."""

    records: list[AdapterRecord]
    cells: list[tuple[str, ...]]
    texts: list[str]


def library_rows(records: list[AdapterRecord]) -> LibraryRows:
    """The ``LibraryRows`` of ``records`` (off the GUI thread)."""
    cells = [cells_of(record) for record in records]
    return LibraryRows(records, cells, ["\n".join(row).casefold() for row in cells])


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
    """The table's rows are the library's adapters that pass the filter (``set_text``: in any
    cell or the tier, case-insensitive; ``set_base``: one base's, None: all) in the order of the
    last ``sort``; the tier column follows the engine's metrics snapshot. ``records`` holds every
    adapter (filtered out or not) in that order.

    Built for libraries of thousands: the rows' text comes made (``LibraryRows``); filtering and
    sorting run in Python over it and move the rows in one layout change (no per-row call from
    Qt, as a proxy model would make); a refresh that keeps the same adapters redraws only the
    rows whose records changed, and a tier update only the rows whose tier changed.
    """

    def __init__(self) -> None:
        super().__init__()
        self.records: list[AdapterRecord] = []
        self.tiers: dict[str, str] = {}
        self.skipped: dict[str, str] = {}
        self.sort_column, self.sort_order = 0, Qt.SortOrder.AscendingOrder
        self.text = ""  # the filter, casefolded
        self.base: str | None = None  # the base filter's ``base_key``
        self._at: dict[str, int] = {}  # name -> its place in ``records``
        self._cells: list[tuple[str, ...]] = []  # LibraryRows.cells, by place
        self._texts: list[str] = []  # LibraryRows.texts, by place
        self._shown: list[int] = []  # the place of each table row
        self._row: list[int] = []  # the table row of each place (-1: filtered out)

    def set_records(self, rows: LibraryRows, skipped: dict[str, str]) -> bool:
        """Show ``rows``: those whose records (or skip reasons) changed are redrawn in place
        when the library holds the same adapters, else the table is rebuilt (then returns True)."""
        records = rows.records
        if len(records) == len(self.records) and all(r.name in self._at for r in records):
            changed = []
            for index, record in enumerate(records):
                at = self._at[record.name]
                if record != self.records[at] or skipped.get(record.name) != self.skipped.get(record.name):
                    self.records[at] = record
                    self._cells[at], self._texts[at] = rows.cells[index], rows.texts[index]
                    changed.append(at)
            self.skipped = dict(skipped)
            self._places_changed(changed, 0, len(COLUMNS) - 1)
            return False
        self.beginResetModel()
        self.skipped = dict(skipped)
        self._arrange(list(records), rows.cells, rows.texts)
        self._filter()
        self.endResetModel()
        return True

    def set_tiers(self, tiers: dict[str, str]) -> None:
        if tiers == self.tiers:
            return
        moved = {name for name in self.tiers.keys() | tiers.keys() if self.tiers.get(name) != tiers.get(name)}
        self.tiers = dict(tiers)
        self._places_changed([self._at[name] for name in moved if name in self._at], TIER_COLUMN, TIER_COLUMN)

    def set_text(self, text: str) -> None:
        """Show only the adapters with ``text`` in one of their cells ("": every adapter)."""
        if text.casefold() != self.text:
            self.text = text.casefold()
            self._relayout(self._filter)

    def set_base(self, key: str | None) -> None:
        """Show only the adapters of the base ``key`` (``base_key``; None: of every base)."""
        if key != self.base:
            self.base = key
            self._relayout(self._filter)

    def tier(self, name: str) -> str:
        if name in self.skipped:
            return "not served"
        return self.tiers.get(name, "not served")

    def record(self, row: int) -> AdapterRecord:
        """The adapter of table row ``row``."""
        return self.records[self._shown[row]]

    def row_of(self, name: str) -> int | None:
        """The table row of adapter ``name`` (None if it is not in the library or filtered out)."""
        at = self._at.get(name)
        return None if at is None or self._row[at] < 0 else self._row[at]

    def cells(self, name: str) -> tuple[str, ...] | None:
        """The text of adapter ``name``'s row in ``COLUMNS`` order, the tier in place, shown or
        filtered out (None if it is not in the library)."""
        at = self._at.get(name)
        if at is None:
            return None
        cells = list(self._cells[at])
        cells[TIER_COLUMN] = self.tier(name)
        return tuple(cells)

    def sort(self, column: int, order: Qt.SortOrder = Qt.SortOrder.AscendingOrder) -> None:
        """Order the rows by ``column`` (numbers by value, text case-insensitively); the order
        holds through refreshes that keep the same adapters."""
        self.sort_column, self.sort_order = column, order

        def arrange() -> None:
            self._arrange(self.records, self._cells, self._texts)
            self._filter()

        self._relayout(arrange)

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self._shown)

    def columnCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = 0) -> Any:
        if role == Qt.ItemDataRole.DisplayRole and orientation == Qt.Orientation.Horizontal:
            return COLUMNS[section]
        return None

    def data(self, index: Index, role: int = 0) -> Any:
        # the role first: a paint asks each cell for about ten roles, and this model has two
        if role == DISPLAY and index.isValid():
            at, column = self._shown[index.row()], index.column()
            return self.tier(self.records[at].name) if column == TIER_COLUMN else self._cells[at][column]
        if role == TOOL_TIP and index.isValid():
            record = self.record(index.row())
            if record.name in self.skipped:
                return f"Not served: {self.skipped[record.name]}"
            return str(record.path)
        return None

    def _arrange(self, records: list[AdapterRecord], cells: list[tuple[str, ...]], texts: list[str]) -> None:
        """Hold ``records`` (with their cells and filter texts) in the sort order."""
        column = COLUMNS[self.sort_column]
        keys: list[Any]
        if column in SORTED_AS_IS:
            keys = [SORTED_AS_IS[column](record) for record in records]
        elif column == "Tier":
            keys = [self.tier(record.name).casefold() for record in records]
        else:
            keys = [row_cells[self.sort_column].casefold() for row_cells in cells]
        order = sorted(range(len(records)), key=keys.__getitem__, reverse=self.sort_order == DESCENDING)
        self.records = [records[index] for index in order]
        self._cells = [cells[index] for index in order]
        self._texts = [texts[index] for index in order]
        self._at = {record.name: at for at, record in enumerate(self.records)}

    def _passes(self, at: int) -> bool:
        """Whether the adapter at place ``at`` passes the base filter and the text filter."""
        record = self.records[at]
        if self.base is not None and base_key(record) != self.base:
            return False
        return not self.text or self.text in self._texts[at] or self.text in self.tier(record.name).casefold()

    def _filter(self) -> None:
        """The table's rows: the places that pass the filters, in order."""
        if self.text or self.base is not None:
            self._shown = [at for at in range(len(self.records)) if self._passes(at)]
        else:
            self._shown = list(range(len(self.records)))
        self._row = [-1] * len(self.records)
        for row, at in enumerate(self._shown):
            self._row[at] = row

    def _relayout(self, change: Callable[[], None]) -> None:
        """Run ``change`` (a new order or filter) as one layout change: the selection and the
        current row follow their adapters, and are dropped where filtered out."""
        self.layoutAboutToBeChanged.emit()
        persistent = self.persistentIndexList()
        names = [self.records[self._shown[index.row()]].name for index in persistent]
        change()
        moved = []
        for name, index in zip(names, persistent, strict=True):
            row = self.row_of(name)
            moved.append(QModelIndex() if row is None else self.index(row, index.column()))
        self.changePersistentIndexList(persistent, moved)
        self.layoutChanged.emit()

    def _places_changed(self, places: list[int], first_column: int, last_column: int) -> None:
        """Redraw the rows of ``places`` from ``first_column`` to ``last_column``; when a filter
        is set and one of them now passes it or no longer does, filter again instead."""
        if (self.text or self.base is not None) and any(
            self._passes(at) != (self._row[at] >= 0) for at in places
        ):
            self._relayout(self._filter)
            return
        rows = [self._row[at] for at in places if self._row[at] >= 0]
        for first, last in row_runs(rows):
            self.dataChanged.emit(self.index(first, first_column), self.index(last, last_column))
