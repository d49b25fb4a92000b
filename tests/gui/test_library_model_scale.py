"""The Library's model at the size of a large library, checked by behaviour: an update redraws
only the rows that changed, the model sorts and filters its own rows (the filter matches any
cell, the tier included, and follows the tiers), and a selection follows its row through a sort
and a filter."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QItemSelectionModel, Qt

from multilora_studio.adapters.registry_schema import RECORD_COLUMNS, AdapterRecord
from multilora_studio.gui.library_model import (
    COLUMNS,
    TIER_COLUMN,
    LibraryModel,
    library_rows,
)

ROWS = 60


def record(index: int, **changes: object) -> AdapterRecord:
    row = {
        "id": f"id{index}", "name": f"adapter-{index:03d}", "source_kind": "local", "source": f"/src/{index}",
        "revision": None, "requested_revision": None, "folder": f"/lib/{index}", "declared_base": None,
        "base_name": "tiny", "base_digest": "d" * 64, "rank": 1 + index % 7, "alpha": 8.0,
        "targets": "q_proj", "size_bytes": 1000 * (ROWS - index), "created": 0.0, "last_used": None,
        "pinned": 0, "notes": "", "kind": "LoRA", "tokens": "", "tokenizer": "", "state": "active",
        "archive_path": None, "archive_sha256": None, "warm": 0,
    }  # fmt: skip
    row.update(changes)
    return AdapterRecord.from_row([row[column] for column in RECORD_COLUMNS], ())


def filled_model() -> tuple[LibraryModel, list[tuple[int, int, int, int]]]:
    """A model of ROWS adapters, and the (first row, last row, first column, last column) of
    every dataChanged it emits from now on."""
    model = LibraryModel()
    model.set_records(library_rows([record(i) for i in range(ROWS)]), {})
    changes: list[tuple[int, int, int, int]] = []
    model.dataChanged.connect(
        lambda top, bottom, *_: changes.append((top.row(), bottom.row(), top.column(), bottom.column()))
    )
    return model, changes


def test_a_tier_update_redraws_only_the_rows_whose_tier_moved(qapp):
    model, changes = filled_model()
    tiers = {f"adapter-{i:03d}": "disk" for i in range(ROWS)}
    model.set_tiers(tiers)
    changes.clear()
    model.set_tiers({**tiers, "adapter-007": "GPU slot 0", "adapter-008": "CPU", "adapter-040": "CPU"})
    assert changes == [(7, 8, TIER_COLUMN, TIER_COLUMN), (40, 40, TIER_COLUMN, TIER_COLUMN)]
    assert model.index(7, TIER_COLUMN).data() == "GPU slot 0"
    model.set_tiers({**tiers, "adapter-007": "GPU slot 0", "adapter-008": "CPU", "adapter-040": "CPU"})
    assert len(changes) == 2  # nothing moved: nothing redrawn


def test_a_refresh_of_the_same_adapters_redraws_only_the_changed_row(qapp):
    model, changes = filled_model()
    resets: list[bool] = []
    model.modelReset.connect(lambda: resets.append(True))
    records = [record(i) for i in range(ROWS)]
    assert model.set_records(library_rows(records), {}) is False and changes == [] and resets == []
    records[12] = record(12, pinned=1)
    assert model.set_records(library_rows(records), {}) is False
    assert changes == [(12, 12, 0, len(COLUMNS) - 1)] and resets == []
    assert model.index(12, COLUMNS.index("Pinned")).data() == "yes"
    assert model.set_records(library_rows(records[:-1]), {}) is True and resets == [True]  # an adapter went


def test_sorting_orders_the_rows_and_keeps_the_selection(qapp):
    model, _ = filled_model()
    selection = QItemSelectionModel(model)
    selection.select(model.index(3, 0), QItemSelectionModel.SelectionFlag.ClearAndSelect)
    model.sort(COLUMNS.index("Size"), Qt.SortOrder.AscendingOrder)
    sizes = [r.size_bytes for r in model.records]
    assert sizes == sorted(sizes) and model.records[0].name == f"adapter-{ROWS - 1:03d}"
    assert [model.index(row, 0).data() for row in range(ROWS)] == [r.name for r in model.records]
    assert selection.selectedIndexes()[0].data() == "adapter-003"
    model.sort(COLUMNS.index("Rank"), Qt.SortOrder.DescendingOrder)
    assert [r.rank for r in model.records] == sorted((r.rank for r in model.records), reverse=True)
    assert model.row_of("adapter-003") == next(
        row for row in range(ROWS) if model.record(row).name == "adapter-003"
    )


def shown(model: LibraryModel) -> list[str]:
    return [model.index(row, 0).data() for row in range(model.rowCount())]


def test_the_filter_matches_any_cell_and_the_tier(qapp):
    model, _ = filled_model()
    model.set_tiers({"adapter-021": "GPU slot 2"})
    model.set_text("ADAPTER-02")
    assert model.rowCount() == 10
    model.set_text("/src/33")  # the Source column
    assert shown(model) == ["adapter-033"]
    model.set_text("gpu slot")
    assert shown(model) == ["adapter-021"]
    model.set_tiers({"adapter-021": "CPU", "adapter-050": "GPU slot 2"})  # a tier moves: the filter follows
    assert shown(model) == ["adapter-050"]
    model.set_text("")
    assert model.rowCount() == ROWS and model.index(5, 0).isValid()
    assert Path(model.index(5, 0).data(Qt.ItemDataRole.ToolTipRole)) == Path("/lib/5")


def test_a_filter_keeps_the_selection_while_its_row_shows_and_drops_it_after(qapp):
    model, _ = filled_model()
    selection = QItemSelectionModel(model)
    selection.select(model.index(33, 0), QItemSelectionModel.SelectionFlag.ClearAndSelect)
    model.set_text("adapter-03")
    assert shown(model)[0] == "adapter-030" and selection.selectedIndexes()[0].data() == "adapter-033"
    assert model.row_of("adapter-033") == 3 and model.row_of("adapter-040") is None
    assert model.cells("adapter-040") is not None  # filtered out, still in the library
    model.set_text("adapter-04")
    assert selection.selectedIndexes() == []
    model.set_base("name:other")  # no adapter of that base
    assert model.rowCount() == 0
    model.set_base(None)
    model.set_text("")
    assert model.rowCount() == ROWS
