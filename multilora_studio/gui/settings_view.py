"""Settings view: base model, device, dtype and adapter slots; applying restarts the engine with progress."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QApplication,
    QButtonGroup,
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QRadioButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from multilora_studio.engine.config import MAX_SLOTS, SUPPORTED_DTYPES
from multilora_studio.gui.engine_host import LOADING, EngineHost
from multilora_studio.gui.field_labels import FIELD_LABELS, in_field_labels
from multilora_studio.gui.preferences import EngineChoice, Preferences
from multilora_studio.gui.theme import THEMES, set_theme
from multilora_studio.gui.widgets import MessageBanner


def device_names() -> list[str]:
    import torch

    return ["auto", "cpu"] + (
        ["cuda"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else []
    )


class SettingsView(QWidget):
    """Edits an EngineChoice; ``applied(choice)`` asks the window to restart the engine with it."""

    applied = Signal(object)

    def __init__(self, host: EngineHost, prefs: Preferences, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.host = host
        self.prefs = prefs
        self.banner = MessageBanner()
        self.embedded = QRadioButton("Embedded default model (SmolLM2-135M-Instruct, works offline)")
        self.folder = QRadioButton("Local Hugging Face folder")
        self.hub = QRadioButton("Hugging Face Hub repository (pulled into the HF cache)")
        self.sources = QButtonGroup(self)
        for index, button in enumerate((self.embedded, self.folder, self.hub)):
            self.sources.addButton(button, index)
        self.model = QLineEdit(placeholderText="folder path, or ORG/NAME[@REVISION] for the Hub")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        model_row = QHBoxLayout()
        model_row.addWidget(self.model, 1)
        model_row.addWidget(browse)
        self.sources.idToggled.connect(lambda *_: self.model.setEnabled(not self.embedded.isChecked()))

        self.device = QComboBox()
        self.device.setEditable(True)
        self.device.addItems(device_names())
        self.dtype = QComboBox()
        self.dtype.addItems(list(SUPPORTED_DTYPES))
        self.max_loras = QSpinBox(minimum=1, maximum=MAX_SLOTS)
        self.max_lora_rank = QSpinBox(minimum=1, maximum=512)
        self.max_cpu_loras = QSpinBox(minimum=0, maximum=1 << 16)
        self.max_cpu_loras.setSpecialValueText(f"2 × {FIELD_LABELS['max_loras']}")
        self.cpu_threads = QSpinBox(minimum=0, maximum=1024)
        self.cpu_threads.setSpecialValueText("automatic (usable cores − 1)")
        self.cpu_threads.setToolTip("torch threads of the engine's steps when it runs on the CPU")
        self.devices = QLineEdit(placeholderText="one engine on Device; or auto, or cuda:0,cuda:1")
        self.devices.setToolTip(
            "One engine replica per device listed (auto: every visible GPU), behind the same "
            "endpoint; a request goes to a replica that holds its adapter"
        )
        self.dispatch_margin = QSpinBox(minimum=0, maximum=1 << 16)
        self.dispatch_margin.setSuffix(" requests")
        self.dispatch_margin.setToolTip(
            "With several replicas: a request goes to a replica holding its adapter unless that one "
            "has more than this many requests over the least-loaded replica (0: least-loaded only)"
        )
        self.batch_invariant = QCheckBox()
        self.batch_invariant.setToolTip(
            "A request's output does not depend on what else runs with it (slower); "
            "keeps Compare and Evaluate columns comparable"
        )

        model_box = QGroupBox("Base model")
        model_layout = QVBoxLayout(model_box)
        for button in (self.embedded, self.folder, self.hub):
            model_layout.addWidget(button)
        model_layout.addLayout(model_row)
        engine_box = QGroupBox("Engine")
        form = QFormLayout(engine_box)
        form.addRow(FIELD_LABELS["device"], self.device)
        form.addRow(FIELD_LABELS["devices"], self.devices)
        form.addRow(FIELD_LABELS["dispatch_margin"], self.dispatch_margin)
        form.addRow(FIELD_LABELS["dtype"], self.dtype)
        form.addRow(f"{FIELD_LABELS['max_loras']} (max_loras)", self.max_loras)
        form.addRow(f"{FIELD_LABELS['max_lora_rank']} (max_lora_rank)", self.max_lora_rank)
        form.addRow(f"{FIELD_LABELS['max_cpu_loras']} (max_cpu_loras)", self.max_cpu_loras)
        form.addRow(f"{FIELD_LABELS['cpu_threads']} (cpu_threads)", self.cpu_threads)
        form.addRow(f"{FIELD_LABELS['batch_invariant']} (batch_invariant)", self.batch_invariant)

        self.theme = QComboBox()
        self.theme.addItems(["Follow the system", "Light", "Dark"])
        theme = prefs.get("window/theme", "system")
        self.theme.setCurrentIndex(THEMES.index(theme) if theme in THEMES else 0)
        self.theme.currentIndexChanged.connect(self._theme_changed)
        appearance = QGroupBox("Appearance (applies at once)")
        QFormLayout(appearance).addRow("Theme", self.theme)

        self.apply_button = QPushButton("Apply and restart the engine")
        self.apply_button.clicked.connect(self.apply)
        self.revert_button = QPushButton("Revert")
        self.revert_button.clicked.connect(lambda: self.show_choice(self.prefs.engine_choice()))
        self.cancel_button = QPushButton("Cancel loading")
        self.cancel_button.clicked.connect(host.cancel_start)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.status = QLabel()
        self.status.setWordWrap(True)
        buttons = QHBoxLayout()
        buttons.addWidget(self.apply_button)
        buttons.addWidget(self.revert_button)
        buttons.addStretch(1)
        buttons.addWidget(self.cancel_button)

        content = QWidget()
        content.setMaximumWidth(820)
        outer = QHBoxLayout(self)
        outer.addWidget(content)
        outer.addStretch(1)
        layout = QVBoxLayout(content)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.banner)
        layout.addWidget(model_box)
        layout.addWidget(engine_box)
        layout.addLayout(buttons)
        layout.addWidget(self.progress)
        layout.addWidget(self.status)
        layout.addWidget(appearance)
        layout.addStretch(1)
        host.progress.connect(self._progress)
        host.stateChanged.connect(self._state_changed)
        host.failed.connect(self._start_failed)
        host.rejected.connect(
            lambda message: self.banner.show_message(
                f"Not applied: {in_field_labels(message, where='')}. "
                "The engine keeps running with its current settings."
            )
        )
        self.show_choice(prefs.engine_choice())
        self._state_changed(host.state)

    def show_choice(self, choice: EngineChoice) -> None:
        button = {"embedded": self.embedded, "folder": self.folder, "hub": self.hub}[choice.model_source]
        button.setChecked(True)
        self.model.setText(choice.model)
        self.model.setEnabled(choice.model_source != "embedded")
        self.device.setCurrentText(choice.device)
        self.devices.setText(choice.devices)
        self.dispatch_margin.setValue(choice.dispatch_margin)
        self.dtype.setCurrentText(choice.dtype)
        self.max_loras.setValue(choice.max_loras)
        self.max_lora_rank.setValue(choice.max_lora_rank)
        self.max_cpu_loras.setValue(choice.max_cpu_loras)
        self.cpu_threads.setValue(choice.cpu_threads)
        self.batch_invariant.setChecked(choice.batch_invariant)

    def choice(self) -> EngineChoice:
        source = ("embedded", "folder", "hub")[max(0, self.sources.checkedId())]
        return EngineChoice(
            model_source=source,
            model="" if source == "embedded" else self.model.text().strip(),
            device=self.device.currentText().strip(),
            devices=self.devices.text().strip(),
            dispatch_margin=self.dispatch_margin.value(),
            dtype=self.dtype.currentText(),
            max_loras=self.max_loras.value(),
            max_lora_rank=self.max_lora_rank.value(),
            max_cpu_loras=self.max_cpu_loras.value(),
            cpu_threads=self.cpu_threads.value(),
            batch_invariant=self.batch_invariant.isChecked(),
        )

    def apply(self) -> bool:
        """Check the settings and ask for an engine restart; problems show in the banner.

        The window saves the settings once an engine started with them (``MainWindow``).
        """
        choice = self.choice()
        try:
            choice.check()
            if choice.model_source == "folder" and not Path(choice.model).expanduser().is_dir():
                raise ValueError(f"model folder {choice.model} does not exist")
        except ValueError as error:
            self.banner.show_message(in_field_labels(str(error), where=""))
            return False
        self.banner.clear()
        self.applied.emit(choice)
        return True

    def _start_failed(self, message: str) -> None:
        again = " Starting again with the last settings that worked." if self.host.state == LOADING else ""
        self.banner.show_message(
            f"The engine did not start: {in_field_labels(message, where='').rstrip('.')}.{again}"
        )

    def _theme_changed(self, index: int) -> None:
        mode = THEMES[index]
        self.prefs.set("window/theme", mode)
        app = QApplication.instance()
        if isinstance(app, QApplication):
            set_theme(app, mode)

    def _browse(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Choose a Hugging Face model folder")
        if folder:
            self.folder.setChecked(True)
            self.model.setText(folder)

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
