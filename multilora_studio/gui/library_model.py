"""The Library table's model: one row per library adapter, with where its weights are now."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt

from multilora_studio.adapters.registry_schema import AdapterRecord
from multilora_studio.engine import EngineMetrics
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
SORT_ROLE = Qt.ItemDataRole.UserRole
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


class LibraryModel(QAbstractTableModel):
    """Rows are AdapterRecords; the tier column follows the engine's metrics snapshot."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[AdapterRecord] = []
        self.tiers: dict[str, str] = {}
        self.skipped: dict[str, str] = {}

    def set_records(self, records: list[AdapterRecord], skipped: dict[str, str]) -> None:
        self.beginResetModel()
        self.records = list(records)
        self.skipped = dict(skipped)
        self.endResetModel()

    def set_tiers(self, tiers: dict[str, str]) -> None:
        if tiers == self.tiers:
            return
        self.tiers = dict(tiers)
        if self.records:
            self.dataChanged.emit(self.index(0, TIER_COLUMN), self.index(len(self.records) - 1, TIER_COLUMN))

    def tier(self, name: str) -> str:
        if name in self.skipped:
            return "not served"
        return self.tiers.get(name, "not served")

    def record(self, row: int) -> AdapterRecord:
        return self.records[row]

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
        record = self.records[index.row()]
        column = COLUMNS[index.column()]
        if role == Qt.ItemDataRole.DisplayRole:
            return self._display(record, column)
        if role == SORT_ROLE:
            sort_keys = {
                "Rank": record.rank,
                "Size": record.size_bytes,
                "Last used": record.last_used or 0.0,
                "Pinned": int(record.pinned),
            }
            return sort_keys.get(column, self._display(record, column).lower())
        if role == Qt.ItemDataRole.ToolTipRole:
            if record.name in self.skipped:
                return f"Not served: {self.skipped[record.name]}"
            return str(record.path)
        return None

    def _display(self, record: AdapterRecord, column: str) -> str:
        values = {
            "Name": record.name,
            "State": record.state + (", warm" if record.warm else ""),
            "Aliases": ", ".join(record.aliases),
            "Source": ("Hub " if record.source_kind == "hub" else "") + record.source_label,
            "Base": record.base_name,
            "Rank": record.rank_label,
            "Targets": ", ".join(record.targets),
            "Size": format_bytes(record.size_bytes),
            "Tier": self.tier(record.name),
            "Pinned": "yes" if record.pinned else "",
            "Last used": format_time(record.last_used),
        }
        return values[column]
