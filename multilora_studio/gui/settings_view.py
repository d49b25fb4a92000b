"""Settings view: base models, device, dtype and adapter slots; applying restarts the engines.

The Engine settings serve every base model; a base of *More base models* may set its own GPU
slots, largest rank, CPU RAM tier and KV cache (``deploy.base_settings``), kept in its entry of
the models list (``/models/qwen,max-loras=4``, the form of ``serve --model``).
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QApplication,
    QButtonGroup,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QListWidget,
    QProgressBar,
    QPushButton,
    QRadioButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from multilora_studio.deploy.base_settings import BaseSettings
from multilora_studio.engine.config import MAX_SLOTS, SUPPORTED_DTYPES
from multilora_studio.engine.quantization import QUANTIZATIONS, quantization_summary
from multilora_studio.gui.engine_host import LOADING, EngineHost
from multilora_studio.gui.field_labels import FIELD_LABELS, in_field_labels
from multilora_studio.gui.preferences import (
    EMBEDDED,
    ENGINE_DEFAULTS,
    HUB_PREFIX,
    BaseEntry,
    EngineChoice,
    Preferences,
)
from multilora_studio.gui.theme import THEMES, set_theme
from multilora_studio.gui.widgets import MessageBanner, format_bytes, scroll_as_one_page


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
        self.quantization = QComboBox()
        self.quantization.addItem("as the checkpoint is", "")
        for method in QUANTIZATIONS:
            self.quantization.addItem(method, method)
        self.quantization.setToolTip(
            "fp8: an FP8 checkpoint, or a float base quantized to FP8 when it loads; awq / gptq: such a "
            "checkpoint (its adapters trained on the float base are served on it)"
        )
        self.quantization_info = QLabel()  # the base's quantization and the memory it saves
        self.quantization_info.setWordWrap(True)
        self.model.textChanged.connect(self._show_quantization)
        self.sources.idToggled.connect(self._show_quantization)
        self.quantization.currentIndexChanged.connect(self._show_quantization)

        self.device = QComboBox()
        self.device.setEditable(True)
        self.device.addItems(device_names())
        self.dtype = QComboBox()
        self.dtype.addItems(list(SUPPORTED_DTYPES))
        self.max_loras = QSpinBox(minimum=1, maximum=MAX_SLOTS)
        self.max_lora_rank = QSpinBox(minimum=1, maximum=512)
        self.max_cpu_loras = QSpinBox(minimum=0, maximum=1 << 16)
        self.max_cpu_loras.setSpecialValueText(
            f"automatic ({ENGINE_DEFAULTS['cpu_lora_memory_fraction']:.0%} of free host memory)"
        )
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
        quantization_row = QHBoxLayout()
        quantization_row.addWidget(QLabel(f"{FIELD_LABELS['quantization']} (quantization)"))
        quantization_row.addWidget(self.quantization)
        quantization_row.addStretch(1)
        model_layout.addLayout(quantization_row)
        model_layout.addWidget(self.quantization_info)
        bases_box = self._bases_box()
        engine_box = QGroupBox("Engine (every base model, unless it sets its own)")
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
        row = QWidget()
        columns = QHBoxLayout(row)
        columns.addWidget(content)
        columns.addStretch(1)
        scroll_as_one_page(self, row)
        layout = QVBoxLayout(content)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.banner)
        layout.addWidget(model_box)
        layout.addWidget(bases_box)
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

    def _bases_box(self) -> QGroupBox:
        """More base models served beside the first, and how many stay loaded."""
        self.extra_models = QListWidget()
        self.extra_models.setMaximumHeight(72)
        self.extra_models.setToolTip(
            "Each base model is an engine of its own; a request (or a Compare column) for one of its "
            "adapters runs on it"
        )
        add_folder = QPushButton("Add folder…")
        add_folder.clicked.connect(self._browse_extra)
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
        self.max_resident_bases = QSpinBox(minimum=0, maximum=64)
        self.max_resident_bases.setSpecialValueText("all")
        self.max_resident_bases.setToolTip(
            "At most this many base models loaded at once; a request for another unloads the least "
            "recently used idle one first (serve --max-resident-bases)"
        )
        self.keep_alive = QDoubleSpinBox(minimum=0.0, maximum=7 * 86400.0, decimals=0, suffix=" s")
        self.keep_alive.setSpecialValueText("never")
        self.keep_alive.setToolTip(
            "Unload a base model idle this long; its next request loads it (serve --keep-alive)"
        )
        self.kv_cache_gb = QDoubleSpinBox(minimum=0.0, maximum=4096.0, decimals=1, singleStep=0.5)
        self.kv_cache_gb.setSpecialValueText("the engine's sizing")
        self.kv_cache_gb.setToolTip("Each base's KV cache; needed when several base models share a GPU")
        box = QGroupBox("More base models (each with its adapters, as serve --model A --model B)")
        layout = QVBoxLayout(box)
        layout.addWidget(self.extra_models)
        layout.addLayout(buttons)
        form = QFormLayout()
        form.addRow(FIELD_LABELS["max_resident_bases"], self.max_resident_bases)
        form.addRow(FIELD_LABELS["keep_alive"], self.keep_alive)
        form.addRow(FIELD_LABELS["kv_cache_memory_gb"], self.kv_cache_gb)
        layout.addLayout(form)
        layout.addWidget(self._own_box())
        return box

    def _own_box(self) -> QGroupBox:
        """The selected base's own engine settings (0: the shared value)."""
        self.own_max_loras = QSpinBox(minimum=0, maximum=MAX_SLOTS)
        self.own_max_lora_rank = QSpinBox(minimum=0, maximum=512)
        self.own_max_cpu_loras = QSpinBox(minimum=0, maximum=1 << 16)
        self.own_kv_cache_gb = QDoubleSpinBox(minimum=0.0, maximum=4096.0, decimals=1, singleStep=0.5)
        self.own_box = QGroupBox("The selected base's own settings")
        form = QFormLayout(self.own_box)
        for name, spin in self._own_spins().items():
            spin.setSpecialValueText("as above" if name == "kv_cache_memory_gb" else "as Engine")
            spin.valueChanged.connect(self._own_changed)
            form.addRow(f"{FIELD_LABELS[name]} ({name})", spin)
        self.own_box.setEnabled(False)
        self.extra_models.currentRowChanged.connect(self._show_own)
        return self.own_box

    def _own_spins(self) -> dict[str, QSpinBox | QDoubleSpinBox]:
        """The own-settings fields by BaseSettings field."""
        return {
            "max_loras": self.own_max_loras,
            "max_lora_rank": self.own_max_lora_rank,
            "max_cpu_loras": self.own_max_cpu_loras,
            "kv_cache_memory_gb": self.own_kv_cache_gb,
        }

    def _show_own(self, row: int) -> None:
        """Show the own settings of the base in ``row`` (nothing selected, or an entry that does
        not read: disabled)."""
        item = self.extra_models.item(row)
        try:
            own = BaseEntry.parse(item.text()).own if item is not None else None
        except ValueError:
            own = None
        self.own_box.setEnabled(own is not None)
        values = asdict(own) if own is not None else {}
        for name, spin in self._own_spins().items():
            spin.blockSignals(True)
            spin.setValue(values.get(name) or 0)
            spin.blockSignals(False)

    def _own_changed(self, *_: object) -> None:
        """Write the own settings into the selected entry of the models list."""
        item = self.extra_models.currentItem()
        if item is None:
            return
        values = {name: spin.value() or None for name, spin in self._own_spins().items()}
        own = BaseSettings(**values)  # type: ignore[arg-type]
        item.setText(replace(BaseEntry.parse(item.text()), own=own).text)

    def add_extra_model(self, entry: str) -> None:
        """Add a base model to the list (applied with the other settings): a folder, EMBEDDED or
        ``hub:ORG/NAME[@REVISION]`` (``BaseEntry.parse``)."""
        self.extra_models.addItem(entry)

    def _ask_hub_model(self) -> None:
        repo, ok = QInputDialog.getText(
            self, "Add a base model from the Hub", "Repository (ORG/NAME, or ORG/NAME@REVISION):"
        )
        if ok and repo.strip():
            self.add_extra_model(HUB_PREFIX + repo.strip())

    def extra_model_entries(self) -> list[str]:
        return [self.extra_models.item(i).text() for i in range(self.extra_models.count())]

    def _browse_extra(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Choose another base model (a Hugging Face folder)")
        if folder:
            self.add_extra_model(folder)

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
        self.quantization.setCurrentIndex(max(0, self.quantization.findData(choice.quantization)))
        self.extra_models.clear()
        self.extra_models.addItems(list(choice.extra_models))
        self.max_resident_bases.setValue(choice.max_resident_bases)
        self.keep_alive.setValue(choice.keep_alive_s)
        self.kv_cache_gb.setValue(choice.kv_cache_gb)

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
            quantization=self.quantization.currentData() or "",
            extra_models=tuple(self.extra_model_entries()),
            max_resident_bases=self.max_resident_bases.value(),
            keep_alive_s=self.keep_alive.value(),
            kv_cache_gb=self.kv_cache_gb.value(),
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

    def _show_quantization(self, *_: object) -> None:
        """The chosen base's quantization and the memory it saves (a folder's config.json read)."""
        requested = self.quantization.currentData() or None
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
