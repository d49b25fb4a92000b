"""What the window remembers between starts (QSettings): engine settings, geometry, last choices."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from PySide6.QtCore import QByteArray, QSettings

from multilora_studio.deploy import parse_devices
from multilora_studio.deploy.base_settings import BaseSettings, format_model, parse_model
from multilora_studio.deploy.pool_settings import PoolSettings
from multilora_studio.engine import EngineConfig
from multilora_studio.engine.settings import Declared, declared

MODEL_SOURCES = ("embedded", "folder", "hub")
EMBEDDED = "embedded"  # an entry of ``extra_models``: the embedded default model
HUB_PREFIX = "hub:"  # an entry of ``extra_models``: hub:ORG/NAME[@REVISION]
ENGINE_GROUP = "engine"


def shown(cls: type) -> tuple[Declared, ...]:
    """The declared settings of ``cls`` that Settings shows in its forms (those with a group)."""
    return tuple(item for item in declared(cls) if item.setting.group is not None)


WINDOW_SETTINGS = (*shown(EngineConfig), *shown(PoolSettings))
# EngineChoice's fields (the names the window stores) that hold a setting under another name
STORED_AS = {"keep_alive": "keep_alive_s", "kv_cache_memory_gb": "kv_cache_gb"}


@dataclass(frozen=True)
class BaseEntry:
    """One base model of the window: where its weights come from (``source`` as
    ``EngineChoice.model_source``, ``model`` a folder or ``ORG/NAME[@REVISION]``, "" for the
    embedded model) and its own engine settings (``own``; the Engine settings for the rest)."""

    source: str
    model: str = ""
    own: BaseSettings = field(default_factory=BaseSettings)

    @classmethod
    def parse(cls, text: str) -> BaseEntry:
        """An entry of ``extra_models``: ``MODEL[,SETTING=VALUE...]`` (``parse_model``) where
        MODEL is a folder, ``embedded`` or ``hub:ORG/NAME[@REVISION]``."""
        model, own = parse_model(text.strip())
        if model == EMBEDDED:
            return cls("embedded", "", own)
        if model.startswith(HUB_PREFIX):
            return cls("hub", model[len(HUB_PREFIX) :].strip(), own)
        return cls("folder", model, own)

    @property
    def text(self) -> str:
        """The form ``parse`` reads."""
        model = {"embedded": EMBEDDED, "hub": HUB_PREFIX + self.model}.get(self.source, self.model)
        return format_model(model, self.own)


@dataclass(frozen=True)
class EngineChoice:
    """The engine settings a person picks in Settings.

    ``model_source`` is ``embedded`` (the default model), ``folder`` (a HF folder at
    ``model``) or ``hub`` (a Hub repo id in ``model``, pulled into the HF cache first).
    ``max_cpu_loras = 0`` means sized from host memory (EngineConfig's None), ``cpu_threads = 0``
    one less than the usable cores (EngineConfig's None). ``devices`` empty: one engine on
    ``device``; else ``serve --devices``' list (``auto``, ``cuda:0,cuda:1``): one engine replica
    per entry behind the adapter-affinity dispatcher with ``dispatch_margin``. The engine
    settings default to EngineConfig's (the pool's to ``PoolSettings``'), except
    ``batch_invariant``: on in the window, whose Compare and Evaluate views compare outputs that
    must not depend on the batch they ran in.

    ``extra_models``: more base models served beside the first (``BaseEntry.parse``: a folder,
    ``EMBEDDED`` or a Hub repository, with the engine settings it sets for itself), each an
    engine of its own with these settings, in a ``BasePool``: ``max_resident_bases`` (0: all)
    loaded at once, ``keep_alive_s`` (0: never) unloads an idle one, as ``serve --model A
    --model B,max-loras=4 --max-resident-bases N --keep-alive S``; ``kv_cache_gb`` (0: the
    engine's sizing) each engine's KV cache, needed when several bases share a GPU.
    ``quantization``: the bases' (EngineConfig's; "" serves each checkpoint as it is).
    """

    model_source: str = "embedded"
    model: str = ""
    device: str = EngineConfig.device
    dtype: str = EngineConfig.dtype
    max_loras: int = EngineConfig.max_loras
    max_lora_rank: int = EngineConfig.max_lora_rank
    max_cpu_loras: int = EngineConfig.max_cpu_loras or 0
    cpu_threads: int = EngineConfig.cpu_threads or 0
    batch_invariant: bool = True
    enable_prefix_caching: bool = EngineConfig.enable_prefix_caching
    devices: str = PoolSettings.devices or ""
    dispatch_margin: int = PoolSettings.dispatch_margin
    extra_models: tuple[str, ...] = ()
    max_resident_bases: int = PoolSettings.max_resident_bases or 0
    keep_alive_s: float = PoolSettings.keep_alive or 0.0
    kv_cache_gb: float = EngineConfig.kv_cache_memory_gb or 0.0
    quantization: str = EngineConfig.quantization or ""

    def check(self) -> None:
        """ValueError with a clear message for settings the engine would refuse."""
        if self.model_source not in MODEL_SOURCES:
            raise ValueError(f"model source must be one of {', '.join(MODEL_SOURCES)}")
        if self.model_source != "embedded" and not self.model.strip():
            what = "a model folder" if self.model_source == "folder" else "a Hub repository id"
            raise ValueError(f"choose {what} or the embedded default model")
        self.pool_settings()
        self.device_list()
        if any(not entry.strip() for entry in self.extra_models):
            raise ValueError("an entry of the base models list is empty")
        bases = self.bases()
        models: set[tuple[str, str]] = set()
        for base in bases:
            if base.source == "hub" and not base.model:
                raise ValueError(f"{base.text}: name the Hub repository, ORG/NAME[@REVISION]")
            if (base.source, base.model) in models:
                raise ValueError(f"base model {base.text} is listed twice")
            models.add((base.source, base.model))
        self.engine_configs([base.model or None for base in bases])  # EngineConfig checks each

    def bases(self) -> list[BaseEntry]:
        """Every base model: the first (``model_source``, ``model``), then ``extra_models``."""
        first = BaseEntry(self.model_source, "" if self.model_source == "embedded" else self.model.strip())
        return [first, *(BaseEntry.parse(entry) for entry in self.extra_models)]

    def engine_configs(self, folders: list[str | None]) -> list[EngineConfig]:
        """One EngineConfig per base model (``bases``), each at its resolved folder in
        ``folders`` (None: the embedded model) with its own settings."""
        return [
            base.own.apply(self.engine_config(folder))
            for base, folder in zip(self.bases(), folders, strict=True)
        ]

    def setting_values(self) -> dict[str, Any]:
        """The value of each setting of ``WINDOW_SETTINGS``, by setting name (0 or "": None)."""
        return {item.name: getattr(self, STORED_AS.get(item.name, item.name)) for item in WINDOW_SETTINGS}

    def with_settings(self, values: dict[str, Any]) -> EngineChoice:
        """These settings with ``values`` (by setting name, as ``setting_values``)."""
        return replace(self, **{STORED_AS.get(name, name): value for name, value in values.items()})

    def pool_settings(self) -> PoolSettings:
        """The pool's settings (``PoolSettings`` checks them)."""
        values = self.setting_values()
        return PoolSettings(**{item.name: _none(item, values[item.name]) for item in shown(PoolSettings)})

    @property
    def pool_options(self) -> tuple[int | None, float | None]:
        """BasePool's ``max_resident`` and ``keep_alive_s`` for these settings."""
        pool = self.pool_settings()
        return pool.max_resident_bases, pool.keep_alive

    def device_list(self) -> list[str] | None:
        """The replicas' devices, or None for one engine on ``device``."""
        return parse_devices(self.devices) if self.devices.strip() else None

    def engine_config(self, model: str | None) -> EngineConfig:
        """The EngineConfig for these settings with ``model`` resolved to a folder (None: embedded)."""
        values = self.setting_values()
        items = shown(EngineConfig)
        return EngineConfig(model=model, **{item.name: _none(item, values[item.name]) for item in items})

    @property
    def label(self) -> str:
        return "embedded default model" if self.model_source == "embedded" else self.model


def _none(item: Declared, value: Any) -> Any:
    """A window's value of ``item`` as its setting takes it: 0 or "" is None where None is allowed."""
    return None if item.optional and not value else value


class Preferences:
    """Typed access to a QSettings store (the user's, or an INI file in tests and smoke runs)."""

    def __init__(self, settings: QSettings | None = None) -> None:
        self.store = settings if settings is not None else QSettings()

    def engine_choice(self) -> EngineChoice:
        default = EngineChoice()
        values: dict[str, Any] = {}
        for item in fields(EngineChoice):
            fallback = getattr(default, item.name)
            if isinstance(fallback, tuple):  # stored as a JSON list
                stored = self.get(f"{ENGINE_GROUP}/{item.name}", list(fallback))
                values[item.name] = tuple(str(entry) for entry in stored)
            else:
                values[item.name] = self.get(f"{ENGINE_GROUP}/{item.name}", fallback)
        choice = EngineChoice(**values)
        try:
            choice.check()
        except ValueError:
            return default
        return choice

    def set_engine_choice(self, choice: EngineChoice) -> None:
        for key, value in asdict(choice).items():
            self.set(f"{ENGINE_GROUP}/{key}", list(value) if isinstance(value, tuple) else value)
        self.store.sync()

    def get(self, key: str, default: Any) -> Any:
        """A stored value of the same type as ``default`` (the default if missing or unreadable)."""
        raw = self.store.value(key, None)
        if raw is None:
            return default
        if isinstance(default, bool):
            return raw if isinstance(raw, bool) else str(raw).lower() in ("true", "1")
        if isinstance(default, (list, dict)):
            try:
                value = json.loads(raw) if isinstance(raw, str) else raw
            except json.JSONDecodeError:
                return default
            return value if isinstance(value, type(default)) else default
        try:
            return type(default)(raw)
        except (TypeError, ValueError):
            return default

    def set(self, key: str, value: Any) -> None:
        self.store.setValue(key, json.dumps(value) if isinstance(value, (list, dict)) else value)

    def remove(self, key: str) -> None:
        self.store.remove(key)

    def geometry(self, key: str) -> QByteArray | None:
        value = self.store.value(key, None)
        return value if isinstance(value, QByteArray) else None

    def sync(self) -> None:
        self.store.sync()
