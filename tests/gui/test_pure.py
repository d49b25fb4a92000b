"""The GUI's plain-Python parts: divergence, export formats, preferences, error messages."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from PySide6.QtCore import QSettings

from multilora_studio import __version__
from multilora_studio.adapters.adapter_config import parse_adapter_config, read_adapter_config
from multilora_studio.adapters.peft_adapter import AdapterError
from multilora_studio.gui.compare_chat import Conversation
from multilora_studio.gui.compare_export import Comparison, to_json, to_markdown
from multilora_studio.gui.diff import first_difference, utf16_offset
from multilora_studio.gui.preferences import STORED_AS, WINDOW_SETTINGS, EngineChoice, Preferences
from multilora_studio.gui.stop_strings import format_stop_strings, parse_stop_strings
from multilora_studio.gui.tasks import Cancelled, user_message
from multilora_studio.invalid_setting import InvalidSetting
from multilora_studio.run_records import (
    ColumnOutput,
    ColumnOverrides,
    ColumnRun,
    EngineRecord,
    RunHistory,
    RunRecord,
    RunSettings,
)


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


def record() -> RunRecord:
    engine = EngineRecord("tiny", "ab" * 32, "float32", "cpu", 4, 32)
    shared = RunSettings(max_tokens=8, temperature=0.0, seed=5, stop=("\n\n",))
    own = ColumnOverrides(max_tokens=3, stop=("END",))
    return RunRecord(
        engine=engine,
        raw=False,
        system_prompt="Be brief.",
        user_turns=("Say hi", "Again"),
        shared=shared,
        columns=(
            ColumnRun(
                "base",
                None,
                None,
                ColumnOverrides(),
                shared,
                [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}],
                ColumnOutput("Hi there", (1, 2, 3), "stop", None, 0.012, 0.001, 50.0),
            ),
            ColumnRun(
                "pirate",
                "pirate",
                "cd" * 32,
                own,
                shared.with_overrides(own),
                [{"role": "user", "content": "Say hi"}],
                ColumnOutput("Ahoy ```x```", (4, 5, 6), "length"),
            ),
        ),
    )


def test_run_records_round_trip_through_json_and_the_history(tmp_path):
    original = record()
    assert RunRecord.from_json(original.to_json()) == original
    pirate = original.columns[1].settings
    assert (pirate.max_tokens, pirate.stop, pirate.temperature, pirate.seed) == (3, ("END",), 0.0, 5)
    assert pirate.sampling_params().max_tokens == 3 and pirate.sampling_params().stop == ("END",)
    history = RunHistory(tmp_path / "runs", limit=2)
    for created in (1.0, 2.0, 3.0):
        history.add(replace(original, id=f"run-{created:g}", created=created))
    (tmp_path / "runs" / "9999999999999999-broken.json").write_text("{not json")
    assert [r.id for r in history.records()] == [
        "run-3",
        "run-2",
    ]  # the oldest went; the broken one is skipped
    assert history.get("run-2") == replace(original, id="run-2", created=2.0)
    with pytest.raises(ValueError, match="no run"):
        history.get("run-1")
    with pytest.raises(ValueError, match="version"):
        RunRecord.from_json(json.dumps({"record_version": 99}))


def test_export_formats_carry_the_run_record():
    comparison = Comparison(record(), {"pirate": 0})
    data = json.loads(to_json(comparison))
    assert RunRecord.from_dict(data) == comparison.record  # an export can be read back as the record
    assert data["differs_from_base_at"] == {"pirate": 0}
    assert data["engine"]["version"] == __version__ and data["columns"][1]["adapter_digest"] == "cd" * 32
    markdown = to_markdown(comparison)
    assert "sha256 `" + "ab" * 32 + "`" in markdown and "max_loras 4" in markdown
    assert "| base | - | 3 | 50.0 tok/s | 0.01 s | 0.00 s | stop | - | - |" in markdown
    assert "| pirate | `cdcdcdcdcdcd` | 3 | - | - | - | length | char 0 | max_tokens=3," in markdown
    assert "````text\nAhoy ```x```\n````" in markdown  # a fence longer than any inside the text
    assert "**User, turn 2**" in markdown and "Be brief." in markdown


@pytest.mark.parametrize("stops", [(), ("\n\n",), ("END", "a,b", " Q:", "x\\y\t"), ("  ",)])
def test_stop_strings_round_trip_as_one_line(stops):
    assert parse_stop_strings(format_stop_strings(stops)) == stops


def test_stop_strings_are_read_with_escapes_and_bad_escapes_refused():
    assert parse_stop_strings("\\n\\n, END ,, a\\,b") == ("\n\n", "END", "a,b")
    with pytest.raises(ValueError, match="unknown escape"):
        parse_stop_strings("a\\q")


def test_conversation_gives_each_column_its_own_history_and_cuts_at_an_edited_turn():
    chat = Conversation(["base", "pirate"], system_prompt="Be brief.")
    chat.ask("Hi")
    with pytest.raises(ValueError, match="answered"):
        chat.ask("too early")
    chat.answer(0, "Hello.")
    chat.answer(1, "Ahoy!")
    chat.ask("Who are you?")
    assert chat.prompt(1) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Ahoy!"},
        {"role": "user", "content": "Who are you?"},
    ]
    rebuilt = Conversation.from_prompts(
        ["base", "pirate"], [chat.prompt(0), chat.prompt(1)], False, chat.user_turns
    )
    assert rebuilt.answers == [["Hello."], ["Ahoy!"]] and rebuilt.system_prompt == "Be brief."
    assert rebuilt.prompt(0) == chat.prompt(0)
    chat.answer(0, "A model.")
    chat.answer(1, "A pirate.")
    chat.cut(1)
    assert chat.user_turns == ["Hi"] and chat.answers == [["Hello."], ["Ahoy!"]]
    raw = Conversation(["base"], raw=True)
    raw.ask("Once upon a time")
    assert raw.prompt(0) == "Once upon a time"
    raw.answer(0, "...")
    with pytest.raises(ValueError, match="raw"):
        raw.ask("more")


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


def test_every_setting_settings_shows_is_stored_with_its_declared_default():
    choice = EngineChoice()
    window_defaults = {"batch_invariant": True}  # the window's own choice (EngineChoice's docstring)
    for item in WINDOW_SETTINGS:
        stored = getattr(choice, STORED_AS.get(item.name, item.name))
        default = window_defaults.get(item.name, item.default)
        assert stored == (default if default is not None else type(stored)()), item.name


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
    slots = user_message(InvalidSetting.of("max_loras", 0, "must be >= 1, got {value}"))
    assert slots == "'GPU adapter slots' in Settings must be >= 1, got 0"
    assert user_message(ValueError(message)) == message  # labelled once, whatever passes it on
