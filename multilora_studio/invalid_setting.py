"""A refused setting as a type: the message keeps a placeholder where each setting is named, so
that every face writes the setting in its own words (the command line its flag, the window its
label) without reading the message. Shared by every layer: the adapters refuse a rank above
``max_lora_rank`` below the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

FORMS = ("", "=", "()")  # {name}, {name:=}, {name:()}


class SettingWord:
    """How a message names one setting: here by its field name, as the Python API spells it; a face
    subclasses it with its own words. ``{name}`` in a template is ``word()``, ``{name:=}`` and
    ``{name:()}`` are ``with_value("=")`` (``max_lora_rank=16``) and ``with_value("()")``
    (``max_loras (8)``)."""

    def __init__(self, name: str, value: object) -> None:
        self.name = name
        self.value = value

    def word(self) -> str:
        return self.name

    def with_value(self, form: str) -> str:
        return f"{self.word()}={self.value}" if form == "=" else f"{self.word()} ({self.value})"

    def __format__(self, form: str) -> str:
        if form not in FORMS:
            raise ValueError(f"a setting is written {{name}}, {{name:=}} or {{name:()}}, not {form!r}")
        return self.with_value(form) if form else self.word()


class InvalidSetting(ValueError):
    """A setting the caller gave that is refused. ``values``: each setting the message is about and
    its value; ``template``: the message with ``{name}`` (or ``{name:=}``, ``{name:()}``) where a
    setting is named and ``{detail}`` for each of ``details`` (what else the message says).
    ``str()`` names the settings by their field names; ``render`` with a face's words."""

    def __init__(
        self, template: str, values: Mapping[str, object], details: Mapping[str, object] | None = None
    ) -> None:
        self.template = template
        self.values = dict(values)
        self.details = dict(details or {})
        super().__init__(self.render(SettingWord))

    @classmethod
    def of(cls, name: str, value: object, says: str) -> InvalidSetting:
        """Setting ``name`` as the subject of ``says`` (``{value}``: its value), e.g.
        ``InvalidSetting.of("max_loras", 0, "must be >= 1, got {value}")``."""
        return cls("{" + name + "} " + says, {name: value}, {"value": value})

    @property
    def fields(self) -> tuple[str, ...]:
        """The settings the message is about, in the order given."""
        return tuple(self.values)

    def render(self, word: Callable[[str, object], SettingWord]) -> str:
        """The message with each setting written by ``word(name, value)``."""
        return self.template.format_map(
            {**self.details, **{name: word(name, value) for name, value in self.values.items()}}
        )

    def __reduce__(self) -> tuple[type, tuple[str, dict[str, object], dict[str, object]]]:
        return type(self), (self.template, self.values, self.details)  # crosses process boundaries
