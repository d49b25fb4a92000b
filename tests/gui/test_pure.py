"""The GUI's plain-Python parts: divergence, export formats, preferences, error messages."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import QSettings

from multilora_studio.adapters.adapter_config import parse_adapter_config, read_adapter_config
from multilora_studio.adapters.peft_adapter import AdapterError
from multilora_studio.gui.compare_export import ColumnResult, Comparison, to_json, to_markdown
from multilora_studio.gui.diff import first_difference, utf16_offset
from multilora_studio.gui.field_labels import in_field_labels
from multilora_studio.gui.preferences import EngineChoice, Preferences
from multilora_studio.gui.tasks import Cancelled, user_message


@pytest.mark.parametrize(
    ("base", "other", "base_done", "other_done", "expected"),
    [
        ("The cat sat", "The dog sat", False, False, 4),
        ("The cat", "The cat sat", False, False, None),  # base may still say " sat"
        ("The cat", "The cat sat", True, False, 7),  # it will not: the adapter says more
        ("The cat sat", "The cat", False, True, 7),  # the adapter stopped early
        ("same", "same", True, True, None),
        ("", "x", True, False, 0),
    ],
)
def test_first_difference(base, other, base_done, other_done, expected):
    assert first_difference(base, other, base_done, other_done) == expected


def test_first_difference_resumes_from_a_known_prefix_and_counts_utf16():
    assert first_difference("abcdef", "abcxef", False, False, start=3) == 3
    assert utf16_offset("a😀b", 2) == 3  # the emoji is two UTF-16 code units in Qt's text positions


def comparison() -> Comparison:
    return Comparison(
        model="tiny",
        prompt="Say hi",
        chat=True,
        sampling={"max_tokens": 8, "temperature": 0.0},
        columns=[
            ColumnResult("base", "Hi there", 3, "stop", 0.012, 50.0, None),
            ColumnResult("pirate", "Ahoy ```x```", 4, "length", None, None, 0),
        ],
    )


def test_export_formats_keep_every_column():
    data = json.loads(to_json(comparison()))
    assert data["model"] == "tiny" and data["chat"] is True
    assert [o["name"] for o in data["outputs"]] == ["base", "pirate"]
    assert data["outputs"][1]["differs_from_base_at"] == 0
    markdown = to_markdown(comparison())
    assert "| base | 3 | 50.0 tok/s | 12 ms | stop | - |" in markdown
    assert "| pirate | 4 | - | - | length | char 0 |" in markdown
    assert "````text\nAhoy ```x```\n````" in markdown  # a fence longer than any inside the text


def test_preferences_round_trip_and_fall_back_on_bad_values(tmp_path):
    path = str(tmp_path / "settings.ini")
    prefs = Preferences(QSettings(path, QSettings.Format.IniFormat))
    choice = EngineChoice(
        model_source="hub", model="org/model@v1", device="cpu", max_loras=3, max_cpu_loras=9
    )
    prefs.set_engine_choice(choice)
    prefs.set("compare/adapters", ["base", "a"])
    prefs.set("compare/raw", True)
    prefs.set("compare/top_p", 0.5)
    prefs.sync()
    again = Preferences(QSettings(path, QSettings.Format.IniFormat))
    assert again.engine_choice() == choice
    assert again.get("compare/adapters", []) == ["base", "a"]
    assert again.get("compare/raw", False) is True and again.get("compare/top_p", 1.0) == 0.5
    again.store.setValue("engine/max_loras", "many")
    again.store.setValue("compare/adapters", "{not json")
    assert again.engine_choice().max_loras == EngineChoice().max_loras
    assert again.get("compare/adapters", ["base"]) == ["base"]
    again.store.setValue("engine/max_loras", 0)  # the engine would refuse it: back to defaults
    assert again.engine_choice() == EngineChoice()


def test_user_messages_never_carry_a_traceback():
    assert user_message(ValueError("no adapter_config.json in /x")) == "no adapter_config.json in /x"
    assert user_message(Cancelled()) == "cancelled"
    assert user_message(FileNotFoundError(2, "No such file", "/x/y")) == "/x/y does not exist"
    assert user_message(KeyError("k")).startswith("unexpected error (KeyError)")


def test_user_messages_name_settings_as_the_window_labels_them(tiny_adapters):
    folder = tiny_adapters["tiny-r8-all"]
    with pytest.raises(AdapterError) as refused:
        parse_adapter_config(read_adapter_config(folder), folder, max_rank=4)  # the library's own check
    message = user_message(refused.value)
    assert "max_lora_rank" not in message and "--" not in message
    label = "'Largest adapter rank' in Settings"
    assert f"exceeds {label} (4); raise {label}" in message
    slots = user_message(ValueError("max_loras must be >= 1, got 0"))
    assert slots == "'GPU adapter slots' in Settings must be >= 1, got 0"
    assert in_field_labels(message) == message  # labelled once, whatever passes it on
