"""Merge and export: one adapter (or several, with weights) merged into a base of the window and
written as a Hugging Face model folder, registered as a base model of its own; or one adapter
exported as GGUF for llama.cpp and Ollama, as a LoRA file or merged into the model
(``workflows/merge_outputs.py``). Each runs as a task, with progress and cancel.

The dialog merges into the base it picks (the selected adapter's own base, by the library's
digest, unless the person picks another) and lists that base's adapters only; the merge reads
the base's files, so a swapped-out base is merged without loading its engine.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from multilora_studio.adapters.registry_schema import BaseModelRecord
from multilora_studio.gui.engine_host import EngineHost
from multilora_studio.gui.library_ops import base_for
from multilora_studio.gui.tasks import Task
from multilora_studio.gui.widgets import MessageBanner
from multilora_studio.gui.workflows.merge_outputs import (
    FOLDER,
    GGUF_KINDS,
    MERGED_GGUF,
    OUTPUTS,
    export_gguf,
    finished_message,
    gguf_refusal,
    is_gguf,
    suggested_path,
)
from multilora_studio.merge import COMBINATIONS, OUTPUT_DTYPES, MergedModel, parse_shard_size
from multilora_studio.merge.gguf_export import GGUFExport
from multilora_studio.merge.library_merge import merge_into_library, resolve_merge_inputs
from multilora_studio.paths import models_dir

BASE_DTYPE = "as the base"


class MergeDialog(QDialog):
    """A non-modal dialog; ``merged(folder)`` fires when a merged model was written and registered."""

    merged = Signal(str)

    def __init__(self, host: EngineHost, selected: str | None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Merge and export")
        self.resize(640, 520)
        self.host = host
        self.task: Task | None = None
        self.banner = MessageBanner()
        self.adapters = QTableWidget(0, 2)
        self.adapters.setHorizontalHeaderLabels(["Adapter (check to merge)", "Weight"])
        self.adapters.horizontalHeader().setStretchLastSection(True)
        self.adapters.verticalHeader().hide()
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.status = QLabel()
        self.merge_button = QPushButton("Merge")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        close = QPushButton("Close")
        actions = QHBoxLayout()
        actions.addWidget(self.progress, 1)
        actions.addWidget(self.merge_button)
        actions.addWidget(self.cancel_button)
        actions.addWidget(close)
        layout = QVBoxLayout(self)
        layout.addWidget(self.banner)
        layout.addWidget(self.adapters, 1)
        layout.addLayout(self._options())
        layout.addWidget(self.status)
        layout.addLayout(actions)
        self.merge_button.clicked.connect(self.start_merge)
        self.cancel_button.clicked.connect(self.cancel)
        close.clicked.connect(self.close)
        self.adapters.itemChanged.connect(lambda *_: self._suggest_path())
        self._fill(selected)
        self._show_output()

    def _options(self) -> QFormLayout:
        """What to write, the base to merge into, how several adapters combine, the output folder
        or file, dtype or GGUF type, shards, name."""
        self.output = QComboBox()
        self.output.addItems(list(OUTPUTS))
        self.output.currentIndexChanged.connect(lambda *_: self._show_output())
        self.target = QComboBox()
        self.target.setToolTip("The base model to merge into; its adapters are listed")
        self.target.currentIndexChanged.connect(lambda *_: self._fill(None))
        self.combination = QComboBox()
        self.combination.addItems(list(COMBINATIONS))
        self.out = QLineEdit(placeholderText="a new folder for the merged model")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        self.dtype = QComboBox()
        self.dtype.addItems([BASE_DTYPE, *sorted(OUTPUT_DTYPES)])
        self.gguf_type = QComboBox()
        self.gguf_type.addItems(list(GGUF_KINDS))
        self.gguf_type.setToolTip("Other quantizations: llama.cpp's llama-quantize on the written file")
        self.gguf_type.currentIndexChanged.connect(lambda *_: self._suggest_path())
        self.out_label = QLabel("Output folder")
        self.shard_size = QLineEdit("5GB")
        self.name = QLineEdit(placeholderText="base model name (default: the folder's)")
        out_row = QHBoxLayout()
        out_row.addWidget(self.out, 1)
        out_row.addWidget(browse)
        self.form = form = QFormLayout()
        form.addRow("Write", self.output)
        form.addRow("Merge into base model", self.target)
        form.addRow("Several adapters combine", self.combination)
        form.addRow(self.out_label, out_row)
        form.addRow("Weights dtype", self.dtype)
        form.addRow("GGUF type", self.gguf_type)
        form.addRow("Shard size", self.shard_size)
        form.addRow("Name", self.name)
        return form

    def checked(self) -> list[tuple[str, float]]:
        """The adapters checked for merging, with their weights, in table order."""
        return [
            (item.text(), spin.value())
            for item, spin in self._rows()
            if item.checkState() == Qt.CheckState.Checked
        ]

    def set_checked(self, weights: dict[str, float]) -> None:
        """Check exactly the adapters in ``weights`` and set their weights."""
        for item, spin in self._rows():
            item.setCheckState(Qt.CheckState.Checked if item.text() in weights else Qt.CheckState.Unchecked)
            spin.setValue(weights.get(item.text(), spin.value()))

    def reload(self, selected: str | None) -> None:
        """Re-read the library into the table (unless a merge runs), on ``selected``'s base
        with it checked."""
        if self.task is None:
            self._fill(selected)

    def pick_base(self, base: str) -> None:
        """Merge into ``base``: list its adapters (none checked)."""
        self.target.setCurrentIndex(max(0, self.target.findData(base)))

    def _rows(self) -> list[tuple[QTableWidgetItem, QDoubleSpinBox]]:
        rows = []
        for row in range(self.adapters.rowCount()):
            item, spin = self.adapters.item(row, 0), self.adapters.cellWidget(row, 1)
            if item is not None and isinstance(spin, QDoubleSpinBox):
                rows.append((item, spin))
        return rows

    def start_merge(self) -> Task | None:
        """Start what the dialog is set to write (a merged folder, or a GGUF export)."""
        base = self.target.currentData()
        if self.host.pool is None or base is None:
            self.banner.show_message("The engine is not ready yet; merge once it has loaded.", "warning")
            return None
        chosen = self.checked()
        if not chosen:
            self.banner.show_message("Check the adapter (or adapters) to merge.", "warning")
            return None
        out = self.out.text().strip()
        if not out:
            self.banner.show_message(f"Choose the {self.out_label.text().lower()}.", "warning")
            return None
        if is_gguf(self.output.currentText()):
            return self._start_gguf(base, chosen, Path(out))
        registry = self.host.registry
        dtype = None if self.dtype.currentText() == BASE_DTYPE else OUTPUT_DTYPES[self.dtype.currentText()]
        combination, shard_text, name = (
            self.combination.currentText(),
            self.shard_size.text(),
            self.name.text(),
        )

        def work(task: Task) -> tuple[MergedModel, BaseModelRecord]:
            folder = self.host.base_folder(base, task.notify)
            inputs = resolve_merge_inputs(
                registry, [n for n, _ in chosen], [w for _, w in chosen], str(folder), False, task.notify
            )
            return merge_into_library(
                registry,
                inputs,
                Path(out),
                dtype,
                parse_shard_size(shard_text),
                combination,
                name.strip() or None,
                task.notify,
                task.cancel_event,
            )

        self.banner.clear()
        self._busy(True)
        self.task = self.host.tasks.run("merge", work, self._merged, self._failed, self._progress)
        return self.task

    def _start_gguf(self, base: str, chosen: list[tuple[str, float]], out: Path) -> Task | None:
        refusal = gguf_refusal(chosen)
        if refusal is not None:
            self.banner.show_message(refusal, "warning")
            return None
        registry = self.host.registry
        output, kind = self.output.currentText(), self.gguf_type.currentText()

        def work(task: Task) -> GGUFExport:
            folder = self.host.base_folder(base, task.notify)
            inputs = resolve_merge_inputs(registry, [chosen[0][0]], [1.0], str(folder), False, task.notify)
            return export_gguf(output, inputs, out, kind, task.notify, task.cancel_event)

        self.banner.clear()
        self._busy(True)
        self.task = self.host.tasks.run(
            "export-gguf",
            work,
            lambda result: self._exported(finished_message(output, result, kind)),
            self._failed,
            self._progress,
        )
        return self.task

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()
            self.status.setText("Cancelling…")

    def closeEvent(self, event: QCloseEvent) -> None:
        self.cancel()
        super().closeEvent(event)

    def _fill(self, selected: str | None) -> None:
        """The adapters of the picked base (``selected``'s base when given), ``selected`` checked."""
        records = self.host.registry.list_adapters()
        pool = self.host.pool
        if pool is not None:
            base = self.host.base_for_adapter(selected) if selected else self.target.currentData()
            self.target.blockSignals(True)
            self.target.clear()
            for name in pool.names:
                self.target.addItem(name, name)
            self.target.setCurrentIndex(max(0, self.target.findData(base)))
            self.target.blockSignals(False)
            self.form.setRowVisible(self.target, len(pool.names) > 1)
            digests = {name: pool.base(name).digest for name in pool.names}
            records = [r for r in records if base_for(r, digests) == self.target.currentData()]
        self.adapters.blockSignals(True)
        self.adapters.setRowCount(len(records))
        for row, record in enumerate(records):
            item = QTableWidgetItem(record.name)
            item.setFlags(Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Checked if record.name == selected else Qt.CheckState.Unchecked)
            self.adapters.setItem(row, 0, item)
            weight = QDoubleSpinBox()
            weight.setRange(-10.0, 10.0)
            weight.setSingleStep(0.1)
            weight.setValue(1.0)
            self.adapters.setCellWidget(row, 1, weight)
        self.adapters.blockSignals(False)
        self._suggest_path()

    def _show_output(self) -> None:
        """The rows, labels and suggested path of what the dialog is set to write."""
        output = self.output.currentText()
        gguf = is_gguf(output)
        for field in (self.combination, self.dtype, self.shard_size, self.name):
            self.form.setRowVisible(field, not gguf)
        self.form.setRowVisible(self.gguf_type, output == MERGED_GGUF)
        self.out_label.setText("Output file" if gguf else "Output folder")
        self.out.setPlaceholderText("a new NAME.gguf file" if gguf else "a new folder for the merged model")
        self.merge_button.setText("Export" if gguf else "Merge")
        self.out.setModified(False)
        self._suggest_path()

    def _suggest_path(self) -> None:
        chosen = self.checked()
        if chosen and not self.out.isModified():
            names = [name for name, _ in chosen]
            path = suggested_path(
                self.output.currentText(), names, self.gguf_type.currentText(), models_dir()
            )
            self.out.setText(str(path))

    def _browse(self) -> None:
        output, names = self.output.currentText(), [name for name, _ in self.checked()]
        if is_gguf(output):
            path, _ = QFileDialog.getSaveFileName(
                self, "GGUF file to write", self.out.text(), "GGUF files (*.gguf)"
            )
        else:
            folder = QFileDialog.getExistingDirectory(self, "Folder to write the merged model in")
            path = str(suggested_path(FOLDER, names, "", Path(folder))) if folder else ""
        if path:
            self.out.setText(path)
            self.out.setModified(True)

    def _progress(self, fraction: float, message: str) -> None:
        self.progress.setValue(int(fraction * 1000))
        self.status.setText(message)

    def _merged(self, value: tuple[MergedModel, BaseModelRecord]) -> None:
        result, record = value
        self._busy(False)
        self.progress.setValue(1000)
        self.banner.show_message(
            f"Wrote {result.path} ({result.total_bytes / 1e9:.2f} GB) and registered it as base model "
            f"{record.repo_id!r}; choose that folder in Settings to serve it.",
            "success",
        )
        self.merged.emit(str(result.path))

    def _exported(self, message: str) -> None:
        self._busy(False)
        self.progress.setValue(1000)
        self.banner.show_message(message, "success")

    def _failed(self, message: str) -> None:
        cancelled = self.task is not None and self.task.cancelled
        self._busy(False)
        self.progress.setValue(0)
        self.status.clear()
        what = "Export" if is_gguf(self.output.currentText()) else "Merge"
        self.banner.show_message(f"{what} cancelled; nothing was written." if cancelled else message)

    def _busy(self, busy: bool) -> None:
        self.merge_button.setEnabled(not busy)
        self.output.setEnabled(not busy)
        self.cancel_button.setEnabled(busy)
        if not busy:
            self.task = None
