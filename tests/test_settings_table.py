"""docs/python-api.md's table of EngineConfig's fields is what their declarations generate."""

from __future__ import annotations

from pathlib import Path

from multilora_studio.cli.settings_table import DEFAULT_PATH, TABLES, render
from multilora_studio.engine.settings import declared

PAGE = Path(__file__).resolve().parents[1] / DEFAULT_PATH


def test_every_table_is_what_the_declarations_generate():
    text = PAGE.read_text()
    for name in TABLES:
        assert f"<!-- settings: {name} -->" in text
    assert text == render(text), "a table of settings differs from the declarations: run `make docs`"


def test_every_field_of_a_table_is_declared_with_its_meaning():
    for cls in TABLES.values():
        undocumented = [item.name for item in declared(cls) if not item.setting.doc]
        assert undocumented == [] and len(declared(cls)) == len(cls.__dataclass_fields__)
