"""Settings view: base models, device, dtype and adapter slots; applying restarts the engines.

The Engine settings serve every base model; a base of *More base models* may set its own GPU
slots, largest rank, CPU RAM tier and KV cache (``deploy.base_settings``), kept in its entry of
the models list (``/models/qwen,max-loras=4``, the form of ``serve --model``). Each setting's field
is made from its declaration (``setting_form.py``), in the part of Settings its group names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QApplication,
    QComboBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from multilora_studio.deploy.pool_settings import PoolSettings
from multilora_studio.engine import EngineConfig
from multilora_studio.gui.base_model_box import BaseModelBox
from multilora_studio.gui.bases_box import BasesBox
from multilora_studio.gui.engine_host import LOADING, EngineHost
from multilora_studio.gui.field_labels import in_field_labels
from multilora_studio.gui.preferences import EngineChoice, Preferences, shown
from multilora_studio.gui.setting_form import SettingForm
from multilora_studio.gui.theme import THEMES, set_theme
from multilora_studio.gui.widgets import MessageBanner, scroll_as_one_page


def device_names() -> list[str]:
    import torch

    return ["auto", "cpu"] + (
        ["cuda"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else []
    )


class SettingsView(QWidget):
    """Edits an EngineChoice; ``applied(choice)`` asks the window to restart the engine with it.

    A setting's field is ``view.<setting>`` (``view.max_loras``), a base's own one
    ``view.own_<setting>``."""

    applied = Signal(object)

    def __init__(self, host: EngineHost, prefs: Preferences, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.host = host
        self.prefs = prefs
        self.banner = MessageBanner()
        self.model_box = BaseModelBox()
        self.bases_box = BasesBox()
        self.engine_form = SettingForm(self)
        self.forms = (self.model_box.form, self.engine_form, self.bases_box.form)
        engine_box = self._engine_box()
        self.by_name = self._name_parts()
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.status = QLabel()
        self.status.setWordWrap(True)
        content = QWidget()
        content.setMaximumWidth(820)
        row = QWidget()
        columns = QHBoxLayout(row)
        columns.addWidget(content)
        columns.addStretch(1)
        scroll_as_one_page(self, row)
        layout = QVBoxLayout(content)
        layout.setContentsMargins(0, 0, 0, 0)
        for part in (self.banner, self.model_box, self.bases_box, engine_box):
            layout.addWidget(part)
        layout.addLayout(self._buttons())
        layout.addWidget(self.progress)
        layout.addWidget(self.status)
        layout.addWidget(self._appearance_box())
        layout.addStretch(1)
        self._watch_host()
        self.show_choice(prefs.engine_choice())
        self._state_changed(host.state)

    def __getattr__(self, name: str) -> Any:
        """A setting's field (``max_loras``; ``own_max_loras``: the selected base's own), or a
        widget of the *Base model* and *More base models* groups (``embedded``, ``extra_models``)."""
        named = self.__dict__.get("by_name", {})
        if name not in named:
            raise AttributeError(f"{type(self).__name__} has no {name!r}")
        return named[name]

    def _name_parts(self) -> dict[str, QWidget]:
        """What ``__getattr__`` finds."""
        own = self.bases_box.own
        return {
            **{f"own_{setting}": widget for setting, widget in own.form.fields.items()},
            **{setting: widget for form in self.forms for setting, widget in form.fields.items()},
            "own_box": own,
            "extra_models": self.bases_box.extra_models,
            **{name: getattr(self.model_box, name) for name in ("embedded", "folder", "hub", "model")},
            **{name: getattr(self.model_box, name) for name in ("quantization_info", "format_costs")},
        }

    def add_extra_model(self, entry: str) -> None:
        self.bases_box.add_extra_model(entry)

    def extra_model_entries(self) -> list[str]:
        return self.bases_box.extra_model_entries()

    def _engine_box(self) -> QGroupBox:
        """The settings of the group "engine": EngineConfig's (with their field names) and the
        replicas'; the device is typed or picked from those this machine has."""
        device = QComboBox()
        device.setEditable(True)
        device.addItems(device_names())
        box = QGroupBox("Engine (every base model, unless it sets its own)")
        engine = [item for item in shown(EngineConfig) if item.setting.group == "engine"]
        self.engine_form.add(engine, named=True, widgets={"device": device})
        self.engine_form.add(item for item in shown(PoolSettings) if item.setting.group == "engine")
        box.setLayout(self.engine_form.layout)
        return box

    def _buttons(self) -> QHBoxLayout:
        self.apply_button = QPushButton("Apply and restart the engine")
        self.apply_button.clicked.connect(self.apply)
        self.revert_button = QPushButton("Revert")
        self.revert_button.clicked.connect(lambda: self.show_choice(self.prefs.engine_choice()))
        self.cancel_button = QPushButton("Cancel loading")
        self.cancel_button.clicked.connect(self.host.cancel_start)
        buttons = QHBoxLayout()
        buttons.addWidget(self.apply_button)
        buttons.addWidget(self.revert_button)
        buttons.addStretch(1)
        buttons.addWidget(self.cancel_button)
        return buttons

    def _appearance_box(self) -> QGroupBox:
        self.theme = QComboBox()
        self.theme.addItems(["Follow the system", "Light", "Dark"])
        theme = self.prefs.get("window/theme", "system")
        self.theme.setCurrentIndex(THEMES.index(theme) if theme in THEMES else 0)
        self.theme.currentIndexChanged.connect(self._theme_changed)
        appearance = QGroupBox("Appearance (applies at once)")
        QFormLayout(appearance).addRow("Theme", self.theme)
        return appearance

    def _watch_host(self) -> None:
        self.host.progress.connect(self._progress)
        self.host.stateChanged.connect(self._state_changed)
        self.host.failed.connect(self._start_failed)
        self.host.rejected.connect(
            lambda message: self.banner.show_message(
                f"Not applied: {message}. The engine keeps running with its current settings."
            )
        )

    def show_choice(self, choice: EngineChoice) -> None:
        values = choice.setting_values()
        self.model_box.show_model(choice.model_source, choice.model, values)
        self.engine_form.show(values)
        self.bases_box.show_bases(choice.extra_models, values)

    def choice(self) -> EngineChoice:
        source = self.model_box.source()
        model = "" if source == "embedded" else self.model_box.model.text().strip()
        chosen = EngineChoice(
            model_source=source, model=model, extra_models=tuple(self.extra_model_entries())
        )
        return chosen.with_settings(
            {name: value for form in self.forms for name, value in form.values().items()}
        )

    def apply(self) -> bool:
        """Check the settings and ask for an engine restart; problems show in the banner.

        The window saves the settings once an engine started with them (``MainWindow``).
        """
        choice = self.choice()
        try:
            choice.check()
            for base in choice.bases():
                if base.source == "folder" and not Path(base.model).expanduser().is_dir():
                    raise ValueError(f"model folder {base.model} does not exist")
        except ValueError as error:
            self.banner.show_message(in_field_labels(error, where=""))
            return False
        self.banner.clear()
        self.applied.emit(choice)
        return True

    def _start_failed(self, message: str) -> None:
        again = " Starting again with the last settings that worked." if self.host.state == LOADING else ""
        self.banner.show_message(f"The engine did not start: {message.rstrip('.')}.{again}")

    def _theme_changed(self, index: int) -> None:
        mode = THEMES[index]
        self.prefs.set("window/theme", mode)
        app = QApplication.instance()
        if isinstance(app, QApplication):
            set_theme(app, mode)

    def _progress(self, fraction: float, message: str) -> None:
        self.progress.setValue(int(fraction * 1000))
        self.status.setText(message)

    def _state_changed(self, state: str) -> None:
        loading = state == LOADING
        self.cancel_button.setEnabled(loading)
        self.apply_button.setEnabled(not loading)
        if state == "ready":
            self.progress.setValue(1000)
            choice = self.host.choice
            self.status.setText(f"Engine ready: {choice.label if choice else ''}")
        elif state in ("failed", "stopped"):
            self.progress.setValue(0)
            self.status.setText(self.host.error)
