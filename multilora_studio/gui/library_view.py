"""Library view: the adapter table with sort, filter and a base filter; import, pull, pin, rename,
alias, remove, merge and export, details.

Each action that touches an engine runs on a task thread with a lease of the adapter's base
(``EngineHost.lease_for``): a swapped-out base is loaded for it. The library is read on a task
thread too (its records and the table's text of each: about 100 ms for 10,000); the GUI thread
only shows them.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QInputDialog,
    QLineEdit,
    QMessageBox,
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
from multilora_studio.gui.library_model import (
    COLUMNS,
    LibraryModel,
    LibraryRows,
    base_key,
    library_rows,
    tiers_of_bases,
)
from multilora_studio.gui.merge_dialog import MergeDialog
from multilora_studio.gui.tasks import Task
from multilora_studio.gui.widgets import MessageBanner, format_bytes, format_time

MAX_COLUMN_WIDTH = 220
HISTORY_ROWS = 20  # the newest events of an adapter shown in its details
ALL_BASES = "All bases"
BASE_NAME_ROLE = Qt.ItemDataRole.UserRole + 1  # a base filter entry's base name


def aliases_label(record: AdapterRecord) -> str:
    """Its aliases, each with the adapters its first use reads ("support (warms a, b)")."""
    lists = dict(record.alias_warm)
    parts = [a + (f" (warms {', '.join(lists[a])})" if lists.get(a) else "") for a in record.aliases]
    return ", ".join(parts) or "-"


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

        self.filter = QLineEdit(placeholderText="Filter by name, source, base, targets…")
        self.filter.setClearButtonEnabled(True)
        self.filter.textChanged.connect(self.model.set_text)
        self.base_filter = QComboBox()
        self.base_filter.setToolTip("Only the adapters validated against one base model's weights")
        self.base_filter.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.base_filter.currentIndexChanged.connect(
            lambda *_: self.model.set_base(self.base_filter.currentData())
        )
        self.import_button = QPushButton("Import folder…")
        self.pull_button = QPushButton("Pull from Hub…")
        self.pin_button = QPushButton("Pin")
        self.rename_button = QPushButton("Rename…")
        self.alias_button = QPushButton("Add alias…")
        self.remove_button = QPushButton("Remove")
        self.retire_button = QPushButton("Retire")
        self.archive_button = QPushButton("Archive")
        self.warm_button = QPushButton("Warm at start")
        self.alias_warm_button = QPushButton("Warm on alias…")
        self.alias_warm_button.setToolTip(
            "Adapters read into host RAM when a request first uses one of its aliases"
        )
        self.alias_warm_button.clicked.connect(self._ask_alias_warm)
        self.retire_button.setToolTip("Retire: listed, not served. Reactivate: served again")
        self.archive_button.setToolTip("Archive: the files packed into one archive, the folder freed")
        self.warm_button.setToolTip("Read into host RAM at every engine start, before its first request")
        self.retire_button.clicked.connect(lambda: self._lifecycle(self.retire_button))
        self.archive_button.clicked.connect(lambda: self._lifecycle(self.archive_button))
        self.warm_button.clicked.connect(self._toggle_warm)
        self.merge_button = QPushButton("Merge and export…")
        self.merge_dialog: MergeDialog | None = None
        self.merge_button.clicked.connect(self.open_merge_dialog)
        self.import_button.clicked.connect(self._choose_folder)
        self.pull_button.clicked.connect(self.pullRequested)
        self.pin_button.clicked.connect(self._toggle_pin)
        self.rename_button.clicked.connect(self._ask_rename)
        self.alias_button.clicked.connect(self._ask_alias)
        self.remove_button.clicked.connect(self._confirm_remove)
        adding = QHBoxLayout()  # the library's own actions and filters
        for button in (self.import_button, self.pull_button, self.merge_button):
            adding.addWidget(button)
        adding.addStretch(1)
        adding.addWidget(self.base_filter)
        adding.addWidget(self.filter, 2)
        selected = QHBoxLayout()  # the selected adapter's actions (one row: the window's width is small)
        for button in (
            self.pin_button,
            self.rename_button,
            self.alias_button,
            self.retire_button,
            self.archive_button,
            self.warm_button,
            self.alias_warm_button,
            self.remove_button,
        ):
            selected.addWidget(button)
        selected.addStretch(1)

        self.table = FrozenFirstColumnTable()
        self.table.setModel(self.model)
        self.table.setSortingEnabled(True)
        self.table.sortByColumn(0, Qt.SortOrder.AscendingOrder)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setAlternatingRowColors(True)
        self.table.verticalHeader().hide()
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.table.setWordWrap(False)
        self.table.selectionModel().selectionChanged.connect(self._selection_changed)
        self.details = QTextBrowser()
        self.details.setOpenLinks(False)
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
        host.adaptersChanged.connect(self.refresh)
        try:
            self.show_records(library_rows(self.registry.list_adapters()))  # here once, before it shows
        except ValueError as error:
            self.banner.show_message(str(error))

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
        served = {base.digest: base.name for base in bases if base.digest}
        choices = {base_key(r): (r.base_name, r.base_digest) for r in records}
        for digest, name in served.items():
            choices.setdefault(digest, (name, digest))
        chosen = self.base_filter.currentData()
        self.base_filter.blockSignals(True)
        self.base_filter.clear()
        self.base_filter.addItem(ALL_BASES, None)
        for key, (name, digest) in sorted(choices.items(), key=lambda item: item[1]):
            mark = f" (sha256 {digest[:12]})" if digest else " (digest unknown)"
            where = ", served" if digest in served else ""
            self.base_filter.addItem(f"{name}{mark}{where}", key)
            self.base_filter.setItemData(self.base_filter.count() - 1, name, BASE_NAME_ROLE)
        index = self.base_filter.findData(chosen)
        self.base_filter.setCurrentIndex(max(0, index))
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
        for button in (
            self.pin_button,
            self.rename_button,
            self.alias_button,
            self.remove_button,
            self.retire_button,
            self.archive_button,
            self.warm_button,
        ):
            button.setEnabled(record is not None)
        self.pin_button.setText("Unpin" if record is not None and record.pinned else "Pin")
        state = record.state if record is not None else "active"
        self.retire_button.setText("Reactivate" if state == "retired" else "Retire")
        self.retire_button.setEnabled(record is not None and state != "archived")
        self.archive_button.setText("Restore" if state == "archived" else "Archive")
        self.warm_button.setText("Not warm" if record is not None and record.warm else "Warm at start")
        self.alias_warm_button.setEnabled(record is not None and bool(record.aliases))
        self.details.setHtml(self._details_html(record) if record is not None else self._empty_html())

    def _empty_html(self) -> str:
        if self.model.records:  # filtered out or not
            return "<p>Select an adapter to see its details.</p>"
        return (
            "<p>The library is empty.</p><p>Import a PEFT folder (adapter_config.json + "
            "adapter_model.safetensors) or pull an adapter from the Hugging Face Hub.</p>"
        )

    def _details_html(self, record: AdapterRecord) -> str:
        rows = [
            ("Name", record.name),
            ("Aliases", aliases_label(record)),
            ("Tier now", self.model.tier(record.name)),
            ("Source", record.source_label),
            ("Path", str(record.path)),
            ("Base", f"{record.base_name} (sha256 {record.base_digest[:12] or 'unknown'})"),
            ("Declared base", record.declared_base or "-"),
            ("Kind", record.contents_label),
            ("Rank / alpha", f"{record.rank} / {record.alpha:g}"),
            ("Targets", ", ".join(record.targets)),
            ("Size", format_bytes(record.size_bytes)),
            ("Pinned", "yes" if record.pinned else "no"),
            ("Created", format_time(record.created)),
            ("Last used", format_time(record.last_used) or "never"),
            ("Notes", record.notes or "-"),
        ]
        if record.name in self.host.skipped:
            rows.insert(2, ("Not served", self.host.skipped[record.name]))
        rows.insert(1, ("State", record.state + (", warm at start" if record.warm else "")))
        if record.archive_path is not None:
            rows.insert(2, ("Archive", str(record.archive_path)))
        cells = "".join(
            f"<tr><td><b>{html.escape(k)}</b></td><td>{html.escape(v)}</td></tr>" for k, v in rows
        )
        history = "".join(
            f"<tr><td>{html.escape(format_time(e.time))}</td><td>{html.escape(e.event)}</td>"
            f"<td>{html.escape(e.reason)}</td></tr>"
            for e in self.registry.events(record.name)[-HISTORY_ROWS:]
        )
        return (
            f"<h3>{html.escape(record.name)}</h3><table cellspacing='4'>{cells}</table>"
            f"<h4>History</h4><table cellspacing='4'>{history}</table>"
        )

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

    def _choose_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Import a PEFT adapter folder")
        if not folder:
            return
        name, ok = QInputDialog.getText(
            self, "Import adapter", "Name in the library:", text=Path(folder).name
        )
        if not ok:
            return
        pool = self.host.pool
        base = None
        if pool is not None and len(pool.names) > 1:
            base, ok = QInputDialog.getItem(
                self, "Import adapter", "Base model it was trained on:", pool.names, 0, False
            )
            if not ok:
                return
        self.import_folder(folder, name.strip() or None, base)

    def _lifecycle(self, button: QPushButton) -> None:
        name = self.selected_name()
        if name is None:
            return
        action = button.text().lower()
        reason, ok = QInputDialog.getText(self, f"{button.text()} {name}", "Reason (kept in the history):")
        if ok:
            self.change_state(name, action, reason.strip())

    def _toggle_warm(self) -> None:
        name = self.selected_name()
        record = self.registry.find(name) if name else None
        if record is not None:
            self.set_warm(record.name, not record.warm)

    def _toggle_pin(self) -> None:
        name = self.selected_name()
        record = self.registry.find(name) if name else None
        if record is not None:
            self.set_pinned(record.name, not record.pinned)

    def _ask_rename(self) -> None:
        name = self.selected_name()
        if name is None:
            return
        new_name, ok = QInputDialog.getText(self, "Rename adapter", f"New name for {name}:", text=name)
        if ok:
            self.rename(name, new_name)

    def _ask_alias(self) -> None:
        name = self.selected_name()
        if name is None:
            return
        alias, ok = QInputDialog.getText(self, "Add alias", f"Another name for {name}:")
        if ok:
            self.add_alias(name, alias)

    def _ask_alias_warm(self) -> None:
        name = self.selected_name()
        record = self.registry.find(name) if name else None
        if record is None or not record.aliases:
            return
        alias = record.aliases[0]
        if len(record.aliases) > 1:
            alias, ok = QInputDialog.getItem(self, "Warm on alias", "Alias:", list(record.aliases), 0, False)
            if not ok:
                return
        listed = ", ".join(dict(record.alias_warm).get(alias, ()))
        text, ok = QInputDialog.getText(
            self,
            "Warm on alias",
            f"Adapters read into host RAM when a request first uses {alias} (comma-separated):",
            text=listed,
        )
        if ok:
            self.set_alias_warm(alias, [n.strip() for n in text.split(",") if n.strip()])

    def _confirm_remove(self) -> None:
        name = self.selected_name()
        if name is None:
            return
        answer = QMessageBox.question(
            self,
            "Remove adapter",
            f"Remove {name!r} from the library? An imported copy is deleted; a Hub download stays in "
            "the Hugging Face cache.",
        )
        if answer == QMessageBox.StandardButton.Yes:
            self.remove(name)
