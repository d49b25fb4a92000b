"""Settings' *Base model* group: where the first base's weights come from (the embedded model, a
folder, a Hub repository), its quantization and what each format costs and buys."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QButtonGroup,
    QFileDialog,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QRadioButton,
    QVBoxLayout,
    QWidget,
)

from multilora_studio.engine import EngineConfig
from multilora_studio.engine.model.format_costs import FormatCost, base_format_costs, first_gpu_memory
from multilora_studio.engine.model.quantization import quantization_summary
from multilora_studio.gui.preferences import MODEL_SOURCES, shown
from multilora_studio.gui.setting_form import SettingForm, read
from multilora_studio.gui.widgets import format_bytes


class BaseModelBox(QGroupBox):
    """The first base model: ``source()`` one of ``MODEL_SOURCES``, ``model`` its folder or Hub
    id; ``form`` the settings of the group "model" (the quantization)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Base model", parent)
        self.embedded = QRadioButton("Embedded default model (SmolLM2-135M-Instruct, works offline)")
        self.folder = QRadioButton("Local Hugging Face folder")
        self.hub = QRadioButton("Hugging Face Hub repository (pulled into the HF cache)")
        self.sources = QButtonGroup(self)
        self.model = QLineEdit(placeholderText="folder path, or ORG/NAME[@REVISION] for the Hub")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        self.form = SettingForm(self)
        self.form.add(item for item in shown(EngineConfig) if item.setting.group == "model")
        self.quantization_info = QLabel()  # the base's quantization and the memory it saves
        self.quantization_info.setWordWrap(True)
        self.format_costs = QLabel()  # each format's memory and bytes a token, a folder's config read
        self.format_costs.setTextFormat(Qt.TextFormat.RichText)
        self.device_memory = first_gpu_memory()
        layout = QVBoxLayout(self)
        for index, button in enumerate((self.embedded, self.folder, self.hub)):
            self.sources.addButton(button, index)
            layout.addWidget(button)
        row = QHBoxLayout()
        row.addWidget(self.model, 1)
        row.addWidget(browse)
        layout.addLayout(row)
        layout.addLayout(self.form.layout)
        layout.addWidget(self.quantization_info)
        layout.addWidget(self.format_costs)
        self.sources.idToggled.connect(lambda *_: self.model.setEnabled(not self.embedded.isChecked()))
        for signal in (self.model.textChanged, self.sources.idToggled, self.form.edited):
            signal.connect(self._show_quantization)

    def source(self) -> str:
        return MODEL_SOURCES[max(0, self.sources.checkedId())]

    def show_model(self, source: str, model: str, values: Mapping[str, Any]) -> None:
        """Show ``source`` and ``model`` with the settings of ``values`` this group has."""
        self.sources.button(MODEL_SOURCES.index(source)).setChecked(True)
        self.model.setText(model)
        self.model.setEnabled(source != "embedded")
        self.form.show(values)
        self._show_quantization()

    def _show_quantization(self, *_: object) -> None:
        """The chosen base's quantization and the memory it saves (a folder's config.json read)."""
        requested = read(self.form.fields["quantization"]) or None
        folder = self.model.text().strip()
        if self.embedded.isChecked() or (self.folder.isChecked() and folder):
            label, sizes = quantization_summary(
                None if self.embedded.isChecked() else Path(folder), requested
            )
        else:
            label, sizes = "", None
        if sizes is not None and sizes[1] < sizes[0]:
            dense, stored = sizes
            label += (
                f": projections {format_bytes(stored)} instead of {format_bytes(dense)} in bf16 "
                f"(saves {format_bytes(dense - stored)})"
            )
        self.quantization_info.setText(label)
        folder_chosen = self.folder.isChecked() and folder
        costs = base_format_costs(Path(folder), self.device_memory) if folder_chosen else []
        self.format_costs.setText(format_table(costs, requested, self.device_memory))

    def _browse(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Choose a Hugging Face model folder")
        if folder:
            self.folder.setChecked(True)
            self.model.setText(folder)


NOTABLE_RATIO = 1.05  # fewer bytes a token worth a mention (a tiny model is mostly its embeddings)


def format_table(costs: list[FormatCost], requested: str | None, memory: int | None) -> str:
    """Rich text: a row per format (the one ``requested`` picks in bold) with its weights, the
    bytes each decoded token reads (against bf16's) and the KV-cache tokens beside the weights."""
    if not costs:
        return ""
    room = f"KV cache room in {format_bytes(memory)}" if memory is not None else "KV cache room (no GPU)"
    rows = [f"<tr><th align=left>Format</th><th>Weights</th><th>Read a token</th><th>{room}</th></tr>"]
    reference = costs[0].read_per_token
    for cost in costs:
        method = None if cost.quantization is None else cost.quantization.method
        chosen = method == requested or (cost.quantization is not None and not cost.quantization.at_load)
        fewer = reference / cost.read_per_token
        ratio = f" ({fewer:.1f}x fewer)" if fewer >= NOTABLE_RATIO else ""
        tokens = "-" if cost.kv_tokens is None else f"{cost.kv_tokens:,} tokens"
        cells = [
            cost.label,
            format_bytes(cost.weight_bytes),
            format_bytes(cost.read_per_token) + ratio,
            tokens,
        ]
        text = "".join(f"<td>{'<b>' + c + '</b>' if chosen else c}</td>" for c in cells)
        rows.append(f"<tr>{text}</tr>")
    note = "Decode reads every weight once a token: fewer bytes, faster tokens; the rest is the KV cache's."
    return f"<table cellspacing=6>{''.join(rows)}</table><small>{note}</small>"
