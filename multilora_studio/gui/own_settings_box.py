"""Settings' *The selected base's own settings*: the engine settings one base of *More base models*
sets for itself (``deploy.base_settings``), kept in its entry of the models list."""

from __future__ import annotations

from dataclasses import asdict, fields, replace

from PySide6.QtWidgets import QGroupBox, QListWidget, QWidget

from multilora_studio.deploy.base_settings import BaseSettings
from multilora_studio.engine import EngineConfig
from multilora_studio.engine.settings import declaration
from multilora_studio.gui.preferences import BaseEntry
from multilora_studio.gui.setting_form import SettingForm


class OwnSettingsBox(QGroupBox):
    """The own settings of the base selected in ``models`` (0: the shared value, shown above for the
    settings of the *More base models* group, else in Engine); disabled while none is selected."""

    def __init__(self, models: QListWidget, parent: QWidget | None = None) -> None:
        super().__init__("The selected base's own settings", parent)
        self.models = models
        self.form = SettingForm(self)
        items = [declaration(EngineConfig, item.name) for item in fields(BaseSettings)]
        self.form.add([item for item in items if item.setting.group != "bases"], named=True, none="as Engine")
        self.form.add([item for item in items if item.setting.group == "bases"], named=True, none="as above")
        self.setLayout(self.form.layout)
        self.setEnabled(False)
        self.form.edited.connect(self._write)
        models.currentRowChanged.connect(self._show)

    def _show(self, row: int) -> None:
        """Show the own settings of the base in ``row`` (nothing selected, or an entry that does not
        read: disabled)."""
        item = self.models.item(row)
        try:
            own = BaseEntry.parse(item.text()).own if item is not None else None
        except ValueError:
            own = None
        self.setEnabled(own is not None)
        self.form.show(asdict(own) if own is not None else dict.fromkeys(self.form.fields, 0))

    def _write(self) -> None:
        """Write the own settings into the selected entry of the models list."""
        item = self.models.currentItem()
        if item is None:
            return
        own = BaseSettings(**{name: value or None for name, value in self.form.values().items()})
        item.setText(replace(BaseEntry.parse(item.text()), own=own).text)
