"""The engine settings one base of several may set for itself, and the one text form that names
a base model with them: ``MODEL[,SETTING=VALUE...]`` (``serve --model``, the window's models
list), e.g. ``/models/qwen,max-loras=4,kv-cache-gb=2``.

A setting a base leaves out is the shared one (the flag, or Settings' Engine value, whose
default is EngineConfig's): each setting keeps one default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from multilora_studio.engine import EngineConfig
from multilora_studio.engine.settings import declaration
from multilora_studio.invalid_setting import InvalidSetting


@dataclass(frozen=True)
class BaseSettings:
    """One base's own values of the EngineConfig settings a base may set for itself, its fields (None:
    the shared value)."""

    max_loras: int | None = None
    max_lora_rank: int | None = None
    max_cpu_loras: int | None = None
    kv_cache_memory_gb: float | None = None

    def apply(self, config: EngineConfig) -> EngineConfig:
        """``config`` with this base's own values (EngineConfig checks them)."""
        own = {name: value for name, value in dataclasses.asdict(self).items() if value is not None}
        return dataclasses.replace(config, **own) if own else config

    def words(self) -> list[str]:
        """``SETTING=VALUE`` of each value set, in field order."""
        values = dataclasses.asdict(self)
        return [
            f"{word}={values[field]:g}" if isinstance(values[field], float) else f"{word}={values[field]}"
            for word, field in PER_BASE.items()
            if values[field] is not None
        ]


# the form's names (the settings' flags without their dashes) -> BaseSettings' fields
PER_BASE = {
    str(declaration(EngineConfig, item.name).flag_word): item.name
    for item in dataclasses.fields(BaseSettings)
}


def parse_model(text: str) -> tuple[str, BaseSettings]:
    """``MODEL[,SETTING=VALUE...]`` as (MODEL, its own settings); ValueError naming what is wrong.

    Only the ``SETTING=VALUE`` parts at the end are settings, up to an existing folder: a folder
    with commas in its name is taken whole.
    """
    parts = text.split(",")
    values: dict[str, int | float] = {}
    while len(parts) > 1 and "=" in parts[-1] and not Path(",".join(parts)).expanduser().is_dir():
        word, _, value = parts.pop().partition("=")
        word = word.strip()
        if word not in PER_BASE:
            raise ValueError(
                f"{text}: {word!r} is not a setting a base model may set for itself; one of "
                f"{', '.join(PER_BASE)}"
            )
        if PER_BASE[word] in values:
            raise ValueError(f"{text}: {word} is given twice")
        values[PER_BASE[word]] = _number(text, word, value)
    model = ",".join(parts).strip()
    if not model:
        raise ValueError(f"{text}: name the model before its settings (MODEL,SETTING=VALUE)")
    return model, BaseSettings(**values)  # type: ignore[arg-type]


def format_model(model: str, own: BaseSettings) -> str:
    """The form ``parse_model`` reads."""
    return ",".join([model, *own.words()])


def check_kv_sizes(configs: Sequence[EngineConfig], on_gpu: bool) -> None:
    """InvalidSetting when several bases share a GPU and one has no KV cache size: each engine would
    size its cache from the whole GPU's free memory."""
    if len(configs) > 1 and on_gpu and any(config.kv_cache_memory_gb is None for config in configs):
        raise InvalidSetting(
            "{kv_cache_memory_gb}: give each base model's KV cache size (for all, or a base its own "
            "kv-cache-gb) when several share a GPU",
            {"kv_cache_memory_gb": None},
        )


def _number(text: str, word: str, value: str) -> int | float:
    kind = declaration(EngineConfig, PER_BASE[word]).kind
    try:
        return kind(value.strip())
    except ValueError:
        what = "a number of GB" if kind is float else "a whole number"
        raise ValueError(f"{text}: {word} takes {what}, got {value.strip()!r}") from None
