"""The Compare view's inputs: system prompt, message, adapters, shared settings; saved and restored."""

from __future__ import annotations

import random

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QSpinBox,
    QWidget,
)

from multilora_studio.gui.compare_column import MARKDOWN, PLAIN, TOKENS
from multilora_studio.gui.preferences import Preferences
from multilora_studio.gui.stop_strings import format_stop_strings, parse_stop_strings
from multilora_studio.run_records import BASE, ColumnOverrides, RunSettings

DEFAULT_PROMPT = "In one sentence, what is a LoRA adapter?"
SEED_LIMIT = 2**31 - 1  # what a spin box holds; seeds drawn for a run stay below it
VIEWS = {
    MARKDOWN: "Markdown",
    PLAIN: "Plain text (differences from base)",
    TOKENS: "Token divergence from base",
}


class CompareInputs:
    """The input widgets (the view lays them out) and what they say."""

    def __init__(self) -> None:
        self.system = QPlainTextEdit()
        self.system.setPlaceholderText("System prompt (optional; chat only)")
        self.system.setTabChangesFocus(True)
        self.system.setMaximumHeight(64)
        self.prompt = QPlainTextEdit(DEFAULT_PROMPT)
        self.prompt.setPlaceholderText(
            "Type a message; Ctrl+Enter runs it through every ticked adapter, Ctrl+Shift+Enter follows up"
        )
        self.prompt.setTabChangesFocus(True)
        self.raw = QCheckBox("Raw prompt (no chat template)")
        self.raw.toggled.connect(lambda raw: self.system.setEnabled(not raw))
        self.adapters = QListWidget()
        self.adapters.setToolTip("Tick the adapters to compare; 'base' is the model without an adapter")
        shared = RunSettings()  # compare's defaults on the command line too
        self.max_tokens = QSpinBox(minimum=1, maximum=32768, value=shared.max_tokens)
        self.temperature = QDoubleSpinBox(
            minimum=0.0, maximum=5.0, singleStep=0.1, value=shared.temperature, decimals=2
        )
        self.top_p = QDoubleSpinBox(
            minimum=0.01, maximum=1.0, singleStep=0.05, value=shared.top_p, decimals=2
        )
        self.seed = QSpinBox(minimum=-1, maximum=SEED_LIMIT, value=-1)
        self.seed.setSpecialValueText("random")
        self.seed.setToolTip("random: each run draws a seed and records it, so it can be rerun")
        self.stop = QLineEdit()
        self.stop.setPlaceholderText("comma-separated; \\n new line, \\, comma")
        self.ignore_eos = QCheckBox("Ignore end of sequence")
        self.view = QComboBox()
        for key, label in VIEWS.items():
            self.view.addItem(label, key)
        self.overrides: dict[str, ColumnOverrides] = {}

    # ---------------------------------------------------------------- what they say

    def shared_settings(self) -> RunSettings:
        """The shared settings; a random seed is drawn here (ValueError for bad stop strings)."""
        seed = self.seed.value()
        return RunSettings(
            max_tokens=self.max_tokens.value(),
            temperature=self.temperature.value(),
            top_p=self.top_p.value(),
            seed=random.randrange(SEED_LIMIT) if seed < 0 else seed,
            stop=parse_stop_strings(self.stop.text()),
            ignore_eos=self.ignore_eos.isChecked(),
        )

    def show_shared_settings(self, settings: RunSettings) -> None:
        self.max_tokens.setValue(settings.max_tokens)
        self.temperature.setValue(settings.temperature)
        self.top_p.setValue(settings.top_p)
        self.seed.setValue(-1 if settings.seed is None else settings.seed)
        self.stop.setText(format_stop_strings(settings.stop))
        self.ignore_eos.setChecked(settings.ignore_eos)

    @property
    def view_mode(self) -> str:
        return str(self.view.currentData())

    def set_view_mode(self, mode: str) -> None:
        self.view.setCurrentIndex(max(0, self.view.findData(mode)))

    def list_item(self, name: str, label: str, checked: bool) -> QListWidgetItem:
        own = self.overrides.get(name, ColumnOverrides())
        item = QListWidgetItem(label + ("  ⚙" if not own.empty else ""))
        item.setData(Qt.ItemDataRole.UserRole, name)
        item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
        item.setCheckState(Qt.CheckState.Checked if checked else Qt.CheckState.Unchecked)
        if not own.empty:
            item.setToolTip(f"{name} has its own settings (the ⚙ of its column)")
        return item

    # ---------------------------------------------------------------- remembered

    def saved_widgets(self) -> list[QWidget]:
        return [
            self.system,
            self.prompt,
            self.raw,
            self.adapters,
            self.max_tokens,
            self.temperature,
            self.top_p,
            self.seed,
            self.stop,
            self.ignore_eos,
            self.view,
        ]

    def save_state(self, prefs: Preferences, wanted: set[str]) -> None:
        prefs.set("compare/system", self.system.toPlainText())
        prefs.set("compare/prompt", self.prompt.toPlainText())
        prefs.set("compare/raw", self.raw.isChecked())
        prefs.set("compare/adapters", sorted(wanted))
        prefs.set("compare/max_tokens", self.max_tokens.value())
        prefs.set("compare/temperature", self.temperature.value())
        prefs.set("compare/top_p", self.top_p.value())
        prefs.set("compare/seed", self.seed.value())
        prefs.set("compare/stop", self.stop.text())
        prefs.set("compare/ignore_eos", self.ignore_eos.isChecked())
        prefs.set("compare/view", self.view_mode)
        prefs.set(
            "compare/column_settings",
            {name: overrides_dict(o) for name, o in self.overrides.items() if not o.empty},
        )

    def restore_state(self, prefs: Preferences) -> list[str]:
        """Restore the inputs; returns the ticked names."""
        self.system.setPlainText(prefs.get("compare/system", ""))
        self.prompt.setPlainText(prefs.get("compare/prompt", DEFAULT_PROMPT))
        self.raw.setChecked(prefs.get("compare/raw", False))
        self.max_tokens.setValue(prefs.get("compare/max_tokens", 128))
        self.temperature.setValue(prefs.get("compare/temperature", 0.0))
        self.top_p.setValue(prefs.get("compare/top_p", 1.0))
        self.seed.setValue(prefs.get("compare/seed", -1))
        self.stop.setText(prefs.get("compare/stop", ""))
        self.ignore_eos.setChecked(prefs.get("compare/ignore_eos", False))
        self.set_view_mode(prefs.get("compare/view", MARKDOWN))
        self.overrides = {}
        for name, data in prefs.get("compare/column_settings", {}).items():
            try:
                self.overrides[name] = ColumnOverrides.from_dict(data)
            except (TypeError, ValueError):
                continue
        return list(prefs.get("compare/adapters", [BASE]))


def overrides_dict(overrides: ColumnOverrides) -> dict:
    return {
        "temperature": overrides.temperature,
        "max_tokens": overrides.max_tokens,
        "stop": None if overrides.stop is None else list(overrides.stop),
        "seed": overrides.seed,
    }
