"""Pull from the Hub: search adapters of a base, pull one with progress, cancel at any time.

The adapter is validated against the base picked in the dialog (the Library's base filter's,
else the first) and served there: the pull leases that base's engine, so a swapped-out base
is loaded first, its progress shown.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from multilora_studio.adapters.base_model import BaseModelRef
from multilora_studio.adapters.hub import HubModel, search_adapters
from multilora_studio.adapters.pull import PullResult, pull
from multilora_studio.gui.engine_host import EngineHost
from multilora_studio.gui.library_ops import add_to_engine
from multilora_studio.gui.tasks import Task
from multilora_studio.gui.widgets import MessageBanner

SEARCH_LIMIT = 50


class PullDialog(QDialog):
    """A non-modal dialog; ``pulled(name)`` fires when an adapter was added and is served."""

    pulled = Signal(str)

    def __init__(self, host: EngineHost, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Pull an adapter from the Hugging Face Hub")
        self.resize(640, 480)
        self.host = host
        self.task: Task | None = None  # the pull
        self.search_task: Task | None = None
        self.banner = MessageBanner()
        self.results = QListWidget()
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.status = QLabel()
        self.pull_button = QPushButton("Pull")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        close = QPushButton("Close")
        actions = QHBoxLayout()
        actions.addWidget(self.progress, 1)
        actions.addWidget(self.pull_button)
        actions.addWidget(self.cancel_button)
        actions.addWidget(close)
        layout = QVBoxLayout(self)
        layout.addWidget(self.banner)
        layout.addLayout(self._choices())
        layout.addWidget(self.results, 1)
        layout.addWidget(self.status)
        layout.addLayout(actions)
        self.results.currentItemChanged.connect(self._pick)
        self.pull_button.clicked.connect(lambda: self.start_pull(self.repo.text(), self.name.text()))
        self.cancel_button.clicked.connect(self.cancel)
        close.clicked.connect(self.close)

    def _choices(self) -> QFormLayout:
        """The base to serve on, the search, the repository and the library name."""
        self.target = QComboBox()
        self.target.setToolTip("The base model the adapter was trained on: it is validated and served there")
        self.target.currentIndexChanged.connect(self._target_changed)
        self.base = QLineEdit(placeholderText="base model repo id, e.g. ORG/NAME")
        self.query = QLineEdit(placeholderText="words in the adapter's repo id (optional)")
        self.search_button = QPushButton("Search")
        self.search_button.clicked.connect(self.search)
        self.query.returnPressed.connect(self.search)
        self.repo = QLineEdit(placeholderText="ORG/NAME[@REVISION]")
        self.name = QLineEdit(placeholderText="library name (default: the repo id)")
        search_row = QHBoxLayout()
        search_row.addWidget(self.query, 1)
        search_row.addWidget(self.search_button)
        self.form = form = QFormLayout()
        form.addRow("Serve on base model", self.target)
        form.addRow("Adapters of (Hub id)", self.base)
        form.addRow("Search", search_row)
        form.addRow("Repository", self.repo)
        form.addRow("Name", self.name)
        return form

    def show_bases(self, picked: str | None) -> None:
        """List the window's bases in the base picker (shown when there are several), ``picked``
        chosen (None: the one chosen before, else the first)."""
        pool = self.host.pool
        names = pool.names if pool is not None else []
        chosen = picked if picked in names else self.target.currentData()
        self.target.blockSignals(True)
        self.target.clear()
        for name in names:
            self.target.addItem(name, name)
        self.target.setCurrentIndex(max(0, self.target.findData(chosen)))
        self.target.blockSignals(False)
        self.form.setRowVisible(self.target, len(names) > 1)
        self._target_changed()

    def _target_changed(self, *_: object) -> None:
        base = self.target.currentData()
        self.base.setText(self.host.hub_repo_of(base) if base is not None else "")

    def search(self) -> Task:
        base, text = self.base.text().strip(), self.query.text().strip()
        self.results.clear()
        self.status.setText(f"Searching adapters of {base}…")
        self.banner.clear()
        self.search_button.setEnabled(False)
        self.cancel_button.setEnabled(True)

        def found(models: list[HubModel]) -> None:
            if search is not self.search_task:
                return  # cancelled, or a newer search runs
            self._search_over()
            for model in models:
                item = QListWidgetItem(f"{model.repo_id}    ↓{model.downloads or 0}  ♥{model.likes or 0}")
                item.setData(Qt.ItemDataRole.UserRole, model.repo_id)
                self.results.addItem(item)
            self.status.setText(f"{len(models)} adapters of {base}" + (f" matching {text!r}" if text else ""))

        def failed(message: str) -> None:
            if search is not self.search_task:
                return
            self._search_over()
            self.status.clear()
            self.banner.show_message(message)

        search = self.host.tasks.run(
            "hub-search", lambda task: search_adapters(base, text or None, SEARCH_LIMIT), found, failed
        )
        self.search_task = search
        return search

    def _search_over(self) -> None:
        self.search_task = None
        self.search_button.setEnabled(True)
        self.cancel_button.setEnabled(self.task is not None)

    def start_pull(self, ref: str, name: str = "") -> Task | None:
        """Pull ``ref`` for the picked base (``show_bases``) and serve it there."""
        pool = self.host.pool
        if pool is None:
            self.banner.show_message("The engine is not ready yet; pull once it has loaded.", "warning")
            return None
        if not ref.strip():
            self.banner.show_message("Choose a search result or type a repository id.", "warning")
            return None
        registry = self.host.registry
        target = self.target.currentData() or pool.primary

        def work(task: Task) -> tuple[PullResult, str]:
            with self.host.lease(target, task.notify) as engine:
                result = pull(
                    ref.strip(),
                    registry,
                    BaseModelRef.of_engine(engine),
                    name=name.strip() or None,
                    max_rank=engine.config.max_lora_rank,
                    progress=task.notify,
                    cancel=task.cancel_event,
                )
                if result.adapter is None:
                    raise ValueError(f"{ref.strip()} is a base model; choose it in Settings to use it")
                if not engine.has_adapter(result.adapter.name):
                    add_to_engine(registry, engine, result.adapter)
            return result, target

        self.banner.clear()
        self._busy(True)
        self.task = self.host.tasks.run("hub-pull", work, self._pulled, self._failed, self._progress)
        return self.task

    def cancel(self) -> None:
        """Cancel the pull (it stops at its next chunk) or stop waiting for the search."""
        if self.search_task is not None:
            self.search_task.cancel()
            self._search_over()  # a late answer is dropped
            self.status.setText("Search cancelled.")
        if self.task is not None:
            self.task.cancel()
            self.status.setText("Cancelling…")

    def closeEvent(self, event: QCloseEvent) -> None:
        self.cancel()
        super().closeEvent(event)

    def _pick(self, item: QListWidgetItem | None) -> None:
        if item is not None:
            self.repo.setText(item.data(Qt.ItemDataRole.UserRole))

    def _progress(self, fraction: float, message: str) -> None:
        self.progress.setValue(int(fraction * 1000))
        self.status.setText(message)

    def _pulled(self, value: tuple[PullResult, str]) -> None:
        result, base = value
        self._busy(False)
        name = result.adapter.name if result.adapter is not None else result.repo_id
        state = "was already in the library as" if result.already_registered else "was added as"
        self.banner.show_message(
            f"{result.repo_id}@{result.revision[:12]} {state} {name!r}, served on base model {base}.",
            "success",
        )
        self.progress.setValue(1000)
        self.pulled.emit(name)

    def _failed(self, message: str) -> None:
        cancelled = self.task is not None and self.task.cancelled
        self._busy(False)
        self.progress.setValue(0)
        self.status.clear()
        self.banner.show_message("Pull cancelled; nothing was added." if cancelled else message)

    def _busy(self, busy: bool) -> None:
        self.pull_button.setEnabled(not busy)
        self.cancel_button.setEnabled(busy)
        if not busy:
            self.task = None
