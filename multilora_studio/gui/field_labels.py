"""Settings in the window's words: each declared setting's label (``engine/settings.py``), and a
refused setting (``InvalidSetting``) named by its label: ``max_lora_rank=16`` reads ``'Largest
adapter rank' in Settings (16)``."""

from __future__ import annotations

from collections.abc import Mapping

from multilora_studio.deploy.pool_settings import PoolSettings
from multilora_studio.engine import EngineConfig
from multilora_studio.engine.settings import declared
from multilora_studio.invalid_setting import InvalidSetting, SettingWord


def label_vocabulary(*classes: type) -> dict[str, str]:
    """Each declared setting of ``classes`` that the window shows: field name -> its label."""
    return {item.name: item.setting.label for cls in classes for item in declared(cls) if item.setting.label}


# the window's vocabulary: the engine's and the bases' pool's settings
FIELD_LABELS = label_vocabulary(EngineConfig, PoolSettings)


class LabelWord(SettingWord):
    """A setting as the window names it: its quoted label (``labels``') and ``where`` (`` in
    Settings``), its value after it in brackets; a setting the window does not show keeps its field
    name."""

    def __init__(
        self, name: str, value: object, where: str, labels: Mapping[str, str] = FIELD_LABELS
    ) -> None:
        super().__init__(name, value)
        self.label = labels.get(name)
        self.where = where

    def word(self) -> str:
        return f"'{self.label}'{self.where}" if self.label is not None else self.name

    def with_value(self, form: str) -> str:
        return f"{self.word()} ({self.value})" if self.label is not None else super().with_value(form)


def in_field_labels(error: BaseException, where: str = " in Settings") -> str:
    """``error``'s message with each setting it refuses named by its label (``LabelWord``)."""
    if isinstance(error, InvalidSetting):
        return error.render(lambda name, value: LabelWord(name, value, where))
    return str(error)
