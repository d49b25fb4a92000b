"""Compare view: one prompt, any number of adapters plus the base, one batched run, N streaming columns."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from multilora_studio.engine import SamplingParams
from multilora_studio.gui.compare_column import CompareColumn
from multilora_studio.gui.compare_export import ColumnResult, Comparison, to_json, to_markdown
from multilora_studio.gui.compare_run import BASE, CompareRun
from multilora_studio.gui.diff import first_difference
from multilora_studio.gui.engine_host import EngineHost
from multilora_studio.gui.preferences import Preferences
from multilora_studio.gui.widgets import MessageBanner

DEFAULT_PROMPT = "In one sentence, what is a LoRA adapter?"


class CompareView(QWidget):
    """See the module docstring; ``runFinished`` fires when every column of a run has ended."""

    runFinished = Signal()

    def __init__(self, host: EngineHost, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.host = host
        self.run: CompareRun | None = None
        self.columns: list[CompareColumn] = []
        self.comparison: Comparison | None = None
        self._wanted: set[str] = {BASE}
        self._prompt_text = ""
        self.banner = MessageBanner()

        self.prompt = QPlainTextEdit(DEFAULT_PROMPT)
        self.prompt.setPlaceholderText("Type a prompt; Ctrl+Enter runs it through every ticked adapter")
        self.raw = QCheckBox("Raw prompt (no chat template)")
        self.adapters = QListWidget()
        self.adapters.setToolTip("Tick the adapters to compare; 'base' is the model without an adapter")
        self.adapters.itemChanged.connect(self._ticks_changed)
        every, none = QPushButton("All"), QPushButton("None")
        every.clicked.connect(lambda: self.tick_all(True))
        none.clicked.connect(lambda: self.tick_all(False))
        self.max_tokens = QSpinBox(minimum=1, maximum=32768, value=128)
        self.temperature = QDoubleSpinBox(minimum=0.0, maximum=5.0, singleStep=0.1, value=0.0, decimals=2)
        self.top_p = QDoubleSpinBox(minimum=0.01, maximum=1.0, singleStep=0.05, value=1.0, decimals=2)
        self.seed = QSpinBox(minimum=-1, maximum=2**31 - 1, value=-1)
        self.seed.setSpecialValueText("random")
        self.ignore_eos = QCheckBox("Ignore end of sequence")
        self.run_button = QPushButton("Run  (Ctrl+Enter)")
        self.stop_button = QPushButton("Stop  (Esc)")
        self.stop_button.setEnabled(False)
        self.copy_button = QPushButton("Copy Markdown")
        self.markdown_button = QPushButton("Save Markdown…")
        self.json_button = QPushButton("Save JSON…")
        for button in (self.copy_button, self.markdown_button, self.json_button):
            button.setEnabled(False)
        self.run_button.clicked.connect(self.start)
        self.stop_button.clicked.connect(self.stop)
        self.copy_button.clicked.connect(self.copy_markdown)
        self.markdown_button.clicked.connect(lambda: self._save("Markdown (*.md)", ".md"))
        self.json_button.clicked.connect(lambda: self._save("JSON (*.json)", ".json"))
        self.summary = QLabel()

        prompt_box = QVBoxLayout()
        prompt_box.addWidget(QLabel("<b>Prompt</b>"))
        prompt_box.addWidget(self.prompt, 1)
        prompt_box.addWidget(self.raw)
        adapter_box = QVBoxLayout()
        ticks = QHBoxLayout()
        ticks.addWidget(QLabel("<b>Adapters</b>"), 1)
        ticks.addWidget(every)
        ticks.addWidget(none)
        adapter_box.addLayout(ticks)
        adapter_box.addWidget(self.adapters, 1)
        sampling = QFormLayout()
        sampling.addRow("Max tokens", self.max_tokens)
        sampling.addRow("Temperature", self.temperature)
        sampling.addRow("Top p", self.top_p)
        sampling.addRow("Seed", self.seed)
        sampling.addRow(self.ignore_eos)
        top = QHBoxLayout()
        top.addLayout(prompt_box, 3)
        top.addLayout(adapter_box, 2)
        top.addLayout(sampling, 1)
        buttons = QHBoxLayout()
        buttons.addWidget(self.run_button)
        buttons.addWidget(self.stop_button)
        buttons.addWidget(self.summary, 1)
        buttons.addWidget(self.copy_button)
        buttons.addWidget(self.markdown_button)
        buttons.addWidget(self.json_button)

        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.setChildrenCollapsible(False)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(self.splitter)
        controls = QWidget()
        controls_layout = QVBoxLayout(controls)
        controls_layout.setContentsMargins(0, 0, 0, 0)
        controls_layout.addLayout(top)
        controls_layout.addLayout(buttons)
        vertical = QSplitter(Qt.Orientation.Vertical)
        vertical.addWidget(controls)
        vertical.addWidget(scroll)
        vertical.setStretchFactor(1, 3)
        layout = QVBoxLayout(self)
        layout.addWidget(self.banner)
        layout.addWidget(vertical, 1)
        host.adaptersChanged.connect(self.refresh_adapters)
        host.stateChanged.connect(lambda state: self.refresh_adapters())

    # ---------------------------------------------------------------- choices

    def refresh_adapters(self) -> None:
        """List 'base' and every adapter the engine serves, ticked as the person left them."""
        engine = self.host.engine
        names = [BASE, *sorted(info.name for info in engine.list_adapters())] if engine is not None else []
        self.adapters.blockSignals(True)
        self.adapters.clear()
        for name in names:
            item = QListWidgetItem(f"{name} ({engine.model_name})" if name == BASE and engine else name)
            item.setData(Qt.ItemDataRole.UserRole, name)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Checked if name in self._wanted else Qt.CheckState.Unchecked)
            self.adapters.addItem(item)
        self.adapters.blockSignals(False)

    def _ticks_changed(self) -> None:
        listed = {self.adapters.item(i).data(Qt.ItemDataRole.UserRole) for i in range(self.adapters.count())}
        self._wanted = (self._wanted - listed) | set(self.checked_names())

    def checked_names(self) -> list[str]:
        return [
            self.adapters.item(i).data(Qt.ItemDataRole.UserRole)
            for i in range(self.adapters.count())
            if self.adapters.item(i).checkState() == Qt.CheckState.Checked
        ]

    def set_checked(self, names: list[str]) -> None:
        self._wanted = set(names)
        self.adapters.blockSignals(True)
        for i in range(self.adapters.count()):
            item = self.adapters.item(i)
            name = item.data(Qt.ItemDataRole.UserRole)
            item.setCheckState(Qt.CheckState.Checked if name in self._wanted else Qt.CheckState.Unchecked)
        self.adapters.blockSignals(False)
        self.adapters.viewport().update()

    def tick_all(self, checked: bool) -> None:
        state = Qt.CheckState.Checked if checked else Qt.CheckState.Unchecked
        for i in range(self.adapters.count()):
            self.adapters.item(i).setCheckState(state)

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(
            max_tokens=self.max_tokens.value(),
            temperature=self.temperature.value(),
            top_p=self.top_p.value(),
            seed=None if self.seed.value() < 0 else self.seed.value(),
            ignore_eos=self.ignore_eos.isChecked(),
        )

    # ---------------------------------------------------------------- running

    @property
    def running(self) -> bool:
        return self.run is not None

    def start(self) -> bool:
        """Start a run with the current choices; a problem shows in the banner."""
        if self.run is not None:
            return False
        engine = self.host.engine
        if engine is None:
            self.banner.show_message("The engine is not ready yet (see the status bar).", "warning")
            return False
        names = self.checked_names()
        text = self.prompt.toPlainText().strip()
        if not names:
            self.banner.show_message("Tick at least one adapter or the base model.", "warning")
            return False
        if not text:
            self.banner.show_message("Type a prompt first.", "warning")
            return False
        try:
            params = self.sampling_params()
        except ValueError as error:
            self.banner.show_message(str(error))
            return False
        self.banner.clear()
        self._prompt_text = text
        prompt = text if self.raw.isChecked() else [{"role": "user", "content": text}]
        self._clear_columns()
        for name in names:
            column = CompareColumn(name)
            self.columns.append(column)
            self.splitter.addWidget(column)
        run = CompareRun(engine, prompt, names, params)
        run.updated.connect(self._updated)
        run.columnFinished.connect(self._updated)
        run.finished.connect(self._finished)
        run.failed.connect(self._failed)
        self.run = run
        self.comparison = None
        self._set_running(True)
        self.summary.setText(f"{len(names)} requests in one batch on {engine.model_name}…")
        run.start()
        return True

    def stop(self) -> None:
        if self.run is not None:
            self.run.stop()
            self.summary.setText("stopping…")

    def _updated(self, index: int) -> None:
        if self.run is None or index >= len(self.columns):
            return
        self.columns[index].apply(self.run.take(index))
        self._check_differences()

    def _check_differences(self) -> None:
        names = [c.name for c in self.columns]
        if BASE not in names:
            return
        base = self.columns[names.index(BASE)]
        for column in self.columns:
            if column is base or column.diverges_at is not None:
                continue
            index = first_difference(base.text, column.text, base.done, column.done, column.agreed)
            if index is not None:
                column.mark_divergence(index)
            else:
                column.agreed = min(len(base.text), len(column.text))
                if base.done and column.done:
                    column.mark_same()

    def _finished(self) -> None:
        run = self.run
        if run is None:
            return
        for index in range(len(self.columns)):
            self.columns[index].apply(run.take(index))
        self._check_differences()
        self.comparison = self._comparison(run)
        self.run = None
        self._set_running(False)
        tokens = sum(c.tokens for c in self.columns)
        self.summary.setText(f"{len(self.columns)} answers, {tokens} tokens in one batched run")
        self.runFinished.emit()

    def _failed(self, message: str) -> None:
        self.banner.show_message(message)
        self.run = None
        self._set_running(False)
        self.summary.clear()
        self.runFinished.emit()

    def _set_running(self, running: bool) -> None:
        self.run_button.setEnabled(not running)
        self.stop_button.setEnabled(running)
        for button in (self.copy_button, self.markdown_button, self.json_button):
            button.setEnabled(not running and self.comparison is not None)

    def _clear_columns(self) -> None:
        for column in self.columns:
            column.setParent(None)
            column.deleteLater()
        self.columns = []

    # ---------------------------------------------------------------- export

    def _comparison(self, run: CompareRun) -> Comparison:
        params = run.params
        engine = run.engine
        return Comparison(
            model=engine.model_name,
            prompt=self._prompt_text,
            chat=isinstance(run.prompt, list),
            sampling={
                "max_tokens": params.max_tokens,
                "temperature": params.temperature,
                "top_p": params.top_p,
                "seed": params.seed,
                "ignore_eos": params.ignore_eos,
            },
            columns=[
                ColumnResult(
                    c.name, c.text, c.tokens, c.finish_reason, c.ttft_s, c.tokens_per_second, c.diverges_at
                )
                for c in self.columns
            ],
        )

    def copy_markdown(self) -> None:
        if self.comparison is not None:
            QApplication.clipboard().setText(to_markdown(self.comparison))
            self.summary.setText("Markdown copied to the clipboard")

    def export(self, path: str | Path) -> Path:
        """Write the last comparison as Markdown (.md) or JSON (.json)."""
        if self.comparison is None:
            raise ValueError("run a comparison first")
        target = Path(path)
        text = to_json(self.comparison) if target.suffix == ".json" else to_markdown(self.comparison)
        target.write_text(text, encoding="utf-8")
        return target

    def _save(self, kind: str, suffix: str) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export the comparison", f"comparison{suffix}", kind)
        if not path:
            return
        try:
            written = self.export(path if path.endswith(suffix) else path + suffix)
        except (OSError, ValueError) as error:
            self.banner.show_message(f"Could not write {path}: {error}")
        else:
            self.banner.show_message(f"Saved {written}", "success")

    # ---------------------------------------------------------------- remembered choices

    def saved_widgets(self) -> list[QWidget]:
        """The inputs ``save_state`` records (the window saves again when any of them changes)."""
        return [
            self.prompt,
            self.raw,
            self.adapters,
            self.max_tokens,
            self.temperature,
            self.top_p,
            self.seed,
            self.ignore_eos,
        ]

    def save_state(self, prefs: Preferences) -> None:
        prefs.set("compare/prompt", self.prompt.toPlainText())
        prefs.set("compare/raw", self.raw.isChecked())
        prefs.set("compare/adapters", sorted(self._wanted))
        prefs.set("compare/max_tokens", self.max_tokens.value())
        prefs.set("compare/temperature", self.temperature.value())
        prefs.set("compare/top_p", self.top_p.value())
        prefs.set("compare/seed", self.seed.value())
        prefs.set("compare/ignore_eos", self.ignore_eos.isChecked())

    def restore_state(self, prefs: Preferences) -> None:
        self.prompt.setPlainText(prefs.get("compare/prompt", DEFAULT_PROMPT))
        self.raw.setChecked(prefs.get("compare/raw", False))
        self.set_checked(prefs.get("compare/adapters", [BASE]))
        self.max_tokens.setValue(prefs.get("compare/max_tokens", 128))
        self.temperature.setValue(prefs.get("compare/temperature", 0.0))
        self.top_p.setValue(prefs.get("compare/top_p", 1.0))
        self.seed.setValue(prefs.get("compare/seed", -1))
        self.ignore_eos.setChecked(prefs.get("compare/ignore_eos", False))
