"""A setting declared once shows in every face: its flag with its help and default, the command
line's and the window's words for it, its field in Settings with its bounds, its check and its row
in the docs' table. The setting is declared here, on a config made for the test, as the engine's
are (``engine/settings.py``)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest
from PySide6.QtWidgets import QComboBox, QSpinBox

from multilora_studio.cli import settings_table
from multilora_studio.cli.flag_words import FlagWord, flag_vocabulary
from multilora_studio.cli.setting_flags import add_setting_flags, setting_values
from multilora_studio.engine.settings import check_declared, declared, setting
from multilora_studio.gui.field_labels import LabelWord, label_vocabulary
from multilora_studio.gui.setting_form import SettingForm
from multilora_studio.invalid_setting import InvalidSetting


@dataclass
class WidgetConfig:
    """A config with two settings nothing else declares."""

    widget_limit: int | None = setting(
        None,
        doc="widgets at once; `None`: as many as fit",
        flag="--widgets",
        metavar="N",
        help="widgets at once (default: as many as fit)",
        label="Widgets at once",
        tip="How many widgets run at once",
        group="engine",
        low=1,
        high=64,
        none="as many as fit",
    )
    widget_colour: str = setting(
        "red",
        doc="the widgets' colour",
        flag="--widget-colour",
        help="the widgets' colour (default: %(default)s)",
        label="Widget colour",
        group="engine",
        choices=("red", "blue"),
    )

    def __post_init__(self) -> None:
        check_declared(self)


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(prog="widgets")
    add_setting_flags(made, WidgetConfig)
    return made


def test_the_flags_are_made_from_the_declarations():
    actions = {action.dest: action for action in parser()._actions}
    assert actions["widgets"].help == "widgets at once (default: as many as fit)"
    assert actions["widgets"].default is None and actions["widgets"].metavar == "N"
    assert actions["widget_colour"].choices == ("red", "blue") and actions["widget_colour"].default == "red"
    args = parser().parse_args(["--widgets", "5", "--widget-colour", "blue"])
    assert setting_values(WidgetConfig, args) == {"widget_limit": 5, "widget_colour": "blue"}
    assert WidgetConfig(**setting_values(WidgetConfig, args)) == WidgetConfig(5, "blue")
    assert "--widgets N" in parser().format_help()


def test_the_check_is_made_from_the_bounds_and_each_face_names_the_setting_its_way():
    with pytest.raises(InvalidSetting) as refused:
        WidgetConfig(widget_limit=65)
    error = refused.value
    assert str(error) == "widget_limit must be between 1 and 64, got 65" and error.fields == ("widget_limit",)
    with pytest.raises(InvalidSetting, match=r"^widget_colour must be one of red, blue, got .green.$"):
        WidgetConfig(widget_colour="green")

    flags = flag_vocabulary(WidgetConfig)
    assert flags == {"widget_limit": "--widgets", "widget_colour": "--widget-colour"}
    typed = parser().parse_args(["--widgets", "65"])
    in_flags = error.render(lambda name, value: FlagWord(name, value, typed, {"--widgets"}, flags))
    assert in_flags == "--widgets must be between 1 and 64, got 65"

    labels = label_vocabulary(WidgetConfig)
    assert labels == {"widget_limit": "Widgets at once", "widget_colour": "Widget colour"}
    in_labels = error.render(lambda name, value: LabelWord(name, value, " in Settings", labels))
    assert in_labels == "'Widgets at once' in Settings must be between 1 and 64, got 65"


def test_the_settings_form_has_a_field_within_the_bounds(qtbot):
    form = SettingForm()
    form.add(declared(WidgetConfig), named=True)
    limit, colour = form.fields["widget_limit"], form.fields["widget_colour"]
    assert isinstance(limit, QSpinBox) and isinstance(colour, QComboBox)
    assert (limit.minimum(), limit.maximum()) == (0, 64)  # 0: None, "as many as fit"
    assert limit.specialValueText() == "as many as fit" and limit.toolTip() == "How many widgets run at once"
    assert [colour.itemText(i) for i in range(colour.count())] == ["red", "blue"]
    labels = [form.layout.itemAt(row, form.layout.ItemRole.LabelRole).widget().text() for row in range(2)]
    assert labels == ["Widgets at once (widget_limit)", "Widget colour (widget_colour)"]
    edits: list[bool] = []
    form.edited.connect(lambda: edits.append(True))
    form.show({"widget_limit": 5, "widget_colour": "blue"})
    assert form.values() == {"widget_limit": 5, "widget_colour": "blue"} and edits == []
    limit.setValue(7)
    assert form.values()["widget_limit"] == 7 and edits == [True]


def test_the_docs_table_has_a_row_per_setting(monkeypatch):
    monkeypatch.setitem(settings_table.TABLES, "WidgetConfig", WidgetConfig)
    page = "# Widgets\n\n<!-- settings: WidgetConfig -->\nold rows\n<!-- end of settings -->\n"
    assert settings_table.render(page).splitlines()[3:7] == [
        "| field | default | meaning |",
        "| --- | --- | --- |",
        "| `widget_limit` | `None` | widgets at once; `None`: as many as fit |",
        "| `widget_colour` | `red` | the widgets' colour |",
    ]
