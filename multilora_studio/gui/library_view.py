"""Library view: the adapter table with sort, filter and a base filter; import, pull, pin, rename,
alias, remove, merge and export, details.

Each action that touches an engine runs on a task thread with a lease of the adapter's base
(``EngineHost.lease_for``): a swapped-out base is loaded for it. The library is read on a task
thread too (its records and the table's text of each: about 100 ms for 10,000); the GUI thread
only shows them. What each action offers for the selected adapter is
``workflows.library_selection``'s; the buttons and the questions they ask are ``library_actions``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLineEdit,
    QPushButton,
    QSplitter,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from multilora_studio.adapters.registry_schema import AdapterRecord
from multilora_studio.engine import ServingEngine
from multilora_studio.gui import library_ops
from multilora_studio.gui.base_states import BaseState, base_states
from multilora_studio.gui.engine_host import EngineHost
from multilora_studio.gui.frozen_table import FrozenFirstColumnTable
from multilora_studio.gui.library_actions import LibraryQuestions, SelectedButtons
from multilora_studio.gui.library_details import details_html, empty_html
from multilora_studio.gui.library_model import (
    COLUMNS,
    LibraryModel,
    LibraryRows,
    library_rows,
    tiers_of_bases,
)
from multilora_studio.gui.merge_dialog import MergeDialog
from multilora_studio.gui.tasks import Task
from multilora_studio.gui.widgets import MessageBanner
from multilora_studio.gui.workflows.library_selection import SelectedActions, base_filter_entries

MAX_COLUMN_WIDTH = 220
ALL_BASES = "All bases"
BASE_NAME_ROLE = Qt.ItemDataRole.UserRole + 1  # a base filter entry's base name


class LibraryView(QWidget):
    """The adapter library (see the module docstring); every change runs off the GUI thread."""

    pullRequested = Signal()
    refreshed = Signal()  # the table shows the library as last read

    def __init__(self, host: EngineHost, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.host = host
        self.registry = host.registry
        self.reading = False  # a read of the library is in flight
        self._read_again = False  # another was asked for meanwhile
        self.banner = MessageBanner()
        self.model = LibraryModel()
        self.filter, self.base_filter = text_filter(self.model), base_filter(self.model)
        self.import_button = QPushButton("Import folder…")
        self.pull_button = QPushButton("Pull from Hub…")
        self.merge_button = QPushButton("Merge and export…")
        self.merge_dialog: MergeDialog | None = None
        self.selected = SelectedButtons()
        self.pin_button, self.retire_button = self.selected.pin_button, self.selected.retire_button
        self.archive_button, self.alias_warm_button = (
            self.selected.archive_button,
            self.selected.alias_warm_button,
        )
        self.questions = LibraryQuestions(self, self, self.selected)
        self.table = library_table(self.model)
        self.table.selectionModel().selectionChanged.connect(self._selection_changed)
        self.details = QTextBrowser()
        self.details.setOpenLinks(False)
        self.import_button.clicked.connect(self.questions.import_folder)
        self.pull_button.clicked.connect(self.pullRequested)
        self.merge_button.clicked.connect(self.open_merge_dialog)
        self._lay_out()
        host.adaptersChanged.connect(self.refresh)
        try:
            self.show_records(library_rows(self.registry.list_adapters()))  # here once, before it shows
        except ValueError as error:
            self.banner.show_message(str(error))

    def _lay_out(self) -> None:
        adding = QHBoxLayout()  # the library's own actions and filters
        for button in (self.import_button, self.pull_button, self.merge_button):
            adding.addWidget(button)
        adding.addStretch(1)
        adding.addWidget(self.base_filter)
        adding.addWidget(self.filter, 2)
        selected = QHBoxLayout()
        self.selected.lay_out(selected)
        splitter = QSplitter()
        splitter.addWidget(self.table)
        splitter.addWidget(self.details)
        splitter.setStretchFactor(0, 3)
        splitter.setStretchFactor(1, 1)
        layout = QVBoxLayout(self)
        layout.addWidget(self.banner)
        layout.addLayout(adding)
        layout.addLayout(selected)
        layout.addWidget(splitter, 1)

    # ---------------------------------------------------------------- reading

    def refresh(self) -> None:
        """Re-read the library on a task thread, then show it (``refreshed``); refreshes asked
        for while a read runs are served by one more read after it."""
        if self.reading:
            self._read_again = True
            return
        self.reading = True
        self.host.tasks.run(
            "read the library",
            lambda task: library_rows(self.registry.list_adapters()),
            self.show_records,
            self.banner.show_message,
            on_done=self._read_done,
        )

    def _read_done(self) -> None:
        self.reading = False
        if self._read_again:
            self._read_again = False
            self.refresh()

    def show_records(self, rows: LibraryRows) -> None:
        """Show ``rows`` (the library as read), keeping the selection."""
        selected = self.selected_name()
        if self.model.set_records(rows, self.host.skipped):  # other adapters: other widths
            self._fit_columns()
        pool = self.host.pool
        bases = base_states(pool, self.host.load_progress) if pool is not None else []
        self._show_bases(rows.records, bases)
        self.model.set_tiers(tiers_of_bases(bases))
        if selected is not None:
            self.select(selected)
        self._selection_changed()
        self.refreshed.emit()

    def _fit_columns(self) -> None:
        self.table.resizeColumnsToContents()
        for column in range(self.model.columnCount()):
            self.table.setColumnWidth(column, min(self.table.columnWidth(column), MAX_COLUMN_WIDTH))

    def update_metrics(self, bases: list[BaseState]) -> None:
        self.model.set_tiers(tiers_of_bases(bases))

    def _show_bases(self, records: list[AdapterRecord], bases: list[BaseState]) -> None:
        """The base filter's entries: every base of the library's adapters, and every base the
        window serves; the chosen one stays chosen."""
        chosen = self.base_filter.currentData()
        self.base_filter.blockSignals(True)
        self.base_filter.clear()
        self.base_filter.addItem(ALL_BASES, None)
        for entry in base_filter_entries(records, bases):
            self.base_filter.addItem(entry.label, entry.key)
            self.base_filter.setItemData(self.base_filter.count() - 1, entry.name, BASE_NAME_ROLE)
        self.base_filter.setCurrentIndex(max(0, self.base_filter.findData(chosen)))
        self.base_filter.blockSignals(False)
        self.model.set_base(self.base_filter.currentData())

    def filter_base(self, name: str | None) -> bool:
        """Show only the adapters of the base called ``name`` (None: of every base)."""
        index = 0 if name is None else self.base_filter.findData(name, BASE_NAME_ROLE)
        if index >= 0:
            self.base_filter.setCurrentIndex(index)
        return index >= 0

    def filtered_base(self) -> str | None:
        """The served base the base filter shows (None: every base, or a base not served)."""
        pool, key = self.host.pool, self.base_filter.currentData()
        if pool is None or key is None:
            return None
        return next((base for base in pool.names if pool.base(base).digest == key), None)

    def names(self) -> list[str]:
        """Adapter names in table order (after sorting and filtering)."""
        return [self.model.record(row).name for row in range(self.model.rowCount())]

    def row_of(self, name: str) -> dict[str, str]:
        """The displayed cells of ``name``'s row, by column title (filtered out or not)."""
        cells = self.model.cells(name)
        if cells is None:
            raise KeyError(name)
        return dict(zip(COLUMNS, cells, strict=True))

    def selected_name(self) -> str | None:
        rows = self.table.selectionModel().selectedRows()
        if not rows:
            return None
        return self.model.record(rows[0].row()).name

    def select(self, name: str) -> bool:
        row = self.model.row_of(name)
        if row is None:
            return False
        self.table.selectRow(row)
        return True

    def _selection_changed(self, *args: object) -> None:
        name = self.selected_name()
        record = self.registry.find(name) if name else None
        self.selected.show(SelectedActions.of(record))
        if record is None:
            self.details.setHtml(empty_html(bool(self.model.records)))
        else:
            tier, events = self.model.tier(record.name), self.registry.events(record.name)
            self.details.setHtml(details_html(record, tier, self.host.skipped.get(record.name), events))

    # ---------------------------------------------------------------- actions

    def import_folder(
        self, folder: str | Path, name: str | None = None, base: str | None = None
    ) -> Task | None:
        """Validate a PEFT folder against ``base`` (default the first base; loaded for it if it
        is swapped out), import it and serve it there; problems show in the banner."""
        if self.host.pool is None:
            self.banner.show_message("The engine is not ready yet; import once it has loaded.", "warning")
            return None
        path = Path(folder)

        def work(task: Task) -> AdapterRecord:
            with self.host.lease(base) as engine:
                return library_ops.import_adapter(self.registry, engine, path, name)

        return self._run(
            f"import {path.name}",
            work,
            lambda record: f"Imported {record.name!r} (rank {record.rank}, {', '.join(record.targets)}).",
        )

    def remove(self, name: str) -> Task:
        return self._run(
            f"remove {name}",
            self._on_base_of(name, lambda engine: library_ops.remove_adapter(self.registry, engine, name)),
            lambda record: f"Removed {record.name!r}.",
        )

    def set_pinned(self, name: str, pinned: bool) -> Task:
        return self._run(
            f"pin {name}",
            self._on_base_of(
                name, lambda engine: library_ops.set_pinned(self.registry, engine, name, pinned)
            ),
            lambda record: f"{'Pinned' if record.pinned else 'Unpinned'} {record.name!r}.",
        )

    def rename(self, name: str, new_name: str) -> Task:
        return self._run(
            f"rename {name}",
            self._on_base_of(
                name, lambda engine: library_ops.rename_adapter(self.registry, engine, name, new_name)
            ),
            lambda record: f"{name!r} is now called {record.name!r}.",
        )

    def change_state(self, name: str, action: str, reason: str = "") -> Task:
        """Retire, reactivate, archive or restore ``name`` (``library_ops.change_state``)."""
        return self._run(
            f"{action} {name}",
            self._on_base_of(
                name, lambda engine: library_ops.change_state(self.registry, engine, name, action, reason)
            ),
            lambda record: f"{record.name!r} is {record.state}.",
        )

    def set_warm(self, name: str, warm: bool) -> Task:
        return self._run(
            f"warm {name}",
            self._on_base_of(name, lambda engine: library_ops.set_warm(self.registry, engine, name, warm)),
            lambda record: (
                f"{record.name!r} is {'read at every engine start' if record.warm else 'read on first use'}."
            ),
        )

    def _on_base_of(
        self, name: str, work: Callable[[ServingEngine | None], AdapterRecord]
    ) -> Callable[[Task], AdapterRecord]:
        """``work`` for a task: given the engine of the base that serves (or would serve)
        adapter ``name``, leased; given None while no engine runs (the library alone changes)."""
        if self.host.pool is None:
            return lambda task: work(None)

        def leased(task: Task) -> AdapterRecord:
            with self.host.lease_for(name) as engine:
                return work(engine)

        return leased

    def add_alias(self, name: str, alias: str) -> Task:
        return self._run(
            f"alias {name}",
            lambda task: library_ops.add_alias(self.registry, self.host.pool, name, alias),
            lambda record: f"{record.name!r} is now also called {alias.strip()!r}.",
        )

    def set_alias_warm(self, alias: str, names: list[str]) -> Task:
        """Read ``names`` into host RAM when a request first uses ``alias`` (empty: nothing)."""
        return self._run(
            f"warm on {alias}",
            lambda task: library_ops.set_alias_warm(self.registry, self.host.pool, alias, names),
            lambda record: f"The first request by {alias!r} reads {', '.join(names) or 'nothing'}.",
        )

    def _run(
        self, title: str, work: Callable[[Task], AdapterRecord], describe: Callable[[AdapterRecord], str]
    ) -> Task:
        def changed(task: Task) -> tuple[AdapterRecord, LibraryRows]:
            return work(task), library_rows(self.registry.list_adapters())  # the table's rows, made here

        def succeeded(result: tuple[AdapterRecord, LibraryRows]) -> None:
            record, rows = result
            self.show_records(rows)
            self.banner.show_message(describe(record), "success")
            self.host.reload_adapters()

        def failed(message: str) -> None:
            self.banner.show_message(message)
            self.refresh()

        self.banner.show_message(f"{title[0].upper()}{title[1:]}…", "info")
        return self.host.tasks.run(title, changed, succeeded, failed)

    def open_merge_dialog(self) -> MergeDialog:
        """The merge dialog, the selected adapter checked (a dialog already open keeps its state)."""
        if self.merge_dialog is None:
            self.merge_dialog = MergeDialog(self.host, self.selected_name(), self)
        else:
            self.merge_dialog.reload(self.selected_name())
        self.merge_dialog.show()
        self.merge_dialog.raise_()
        return self.merge_dialog


def text_filter(model: LibraryModel) -> QLineEdit:
    edit = QLineEdit(placeholderText="Filter by name, source, base, targets…")
    edit.setClearButtonEnabled(True)
    edit.textChanged.connect(model.set_text)
    return edit


def base_filter(model: LibraryModel) -> QComboBox:
    combo = QComboBox()
    combo.setToolTip("Only the adapters validated against one base model's weights")
    combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
    combo.currentIndexChanged.connect(lambda *_: model.set_base(combo.currentData()))
    return combo


def library_table(model: LibraryModel) -> FrozenFirstColumnTable:
    """The adapter table: sorted by name, one row selected at a time, the name column in place."""
    table = FrozenFirstColumnTable()
    table.setModel(model)
    table.setSortingEnabled(True)
    table.sortByColumn(0, Qt.SortOrder.AscendingOrder)
    table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    table.setAlternatingRowColors(True)
    table.verticalHeader().hide()
    table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
    table.horizontalHeader().setStretchLastSection(True)
    table.setTextElideMode(Qt.TextElideMode.ElideMiddle)
    table.setWordWrap(False)
    return table
