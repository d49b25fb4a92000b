"""Settings' *More base models*: the bases served beside the first (as ``serve --model A --model B``),
how many stay loaded and for how long, each one's KV cache, and the selected one's own settings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from PySide6.QtWidgets import (
    QFileDialog,
    QGroupBox,
    QHBoxLayout,
    QInputDialog,
    QListWidget,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from multilora_studio.deploy.pool_settings import PoolSettings
from multilora_studio.engine import EngineConfig
from multilora_studio.gui.own_settings_box import OwnSettingsBox
from multilora_studio.gui.preferences import EMBEDDED, HUB_PREFIX, shown
from multilora_studio.gui.setting_form import SettingForm


class BasesBox(QGroupBox):
    """The models list (``extra_models``), the settings of the group "bases" (``form``) and the selected
    base's own settings (``own``)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("More base models (each with its adapters, as serve --model A --model B)", parent)
        self.extra_models = QListWidget()
        self.extra_models.setMaximumHeight(72)
        self.extra_models.setToolTip(
            "Each base model is an engine of its own; a request (or a Compare column) for one of its "
            "adapters runs on it"
        )
        self.form = SettingForm(self)
        for cls in (PoolSettings, EngineConfig):
            self.form.add(item for item in shown(cls) if item.setting.group == "bases")
        self.own = OwnSettingsBox(self.extra_models)
        layout = QVBoxLayout(self)
        layout.addWidget(self.extra_models)
        layout.addLayout(self._buttons())
        layout.addLayout(self.form.layout)
        layout.addWidget(self.own)

    def _buttons(self) -> QHBoxLayout:
        add_folder = QPushButton("Add folder…")
        add_folder.clicked.connect(self._browse)
        add_hub = QPushButton("Add Hub repository…")
        add_hub.setToolTip("A base model on the Hugging Face Hub, pulled into the HF cache when applied")
        add_hub.clicked.connect(self._ask_hub_model)
        add_embedded = QPushButton("Add the embedded model")
        add_embedded.clicked.connect(lambda: self.add_extra_model(EMBEDDED))
        remove = QPushButton("Remove")
        remove.clicked.connect(lambda: self.extra_models.takeItem(self.extra_models.currentRow()))
        buttons = QHBoxLayout()
        for button in (add_folder, add_hub, add_embedded, remove):
            buttons.addWidget(button)
        buttons.addStretch(1)
        return buttons

    def add_extra_model(self, entry: str) -> None:
        """Add a base model to the list (applied with the other settings): a folder, EMBEDDED or
        ``hub:ORG/NAME[@REVISION]`` (``BaseEntry.parse``)."""
        self.extra_models.addItem(entry)

    def extra_model_entries(self) -> list[str]:
        return [self.extra_models.item(i).text() for i in range(self.extra_models.count())]

    def show_bases(self, entries: Sequence[str], values: Mapping[str, Any]) -> None:
        """Show the models list ``entries`` and the settings of ``values`` this group has."""
        self.extra_models.clear()
        self.extra_models.addItems(list(entries))
        self.form.show(values)

    def _ask_hub_model(self) -> None:
        repo, ok = QInputDialog.getText(
            self, "Add a base model from the Hub", "Repository (ORG/NAME, or ORG/NAME@REVISION):"
        )
        if ok and repo.strip():
            self.add_extra_model(HUB_PREFIX + repo.strip())

    def _browse(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Choose another base model (a Hugging Face folder)")
        if folder:
            self.add_extra_model(folder)
