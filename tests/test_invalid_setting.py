"""A refused setting keeps the settings it is about: its message reads as before with their field
names, each face writes its own words for them, and it crosses a process boundary whole."""

from __future__ import annotations

import pickle

import pytest

from multilora_studio.adapters.adapter_files import AdapterError, AdapterOverLimit
from multilora_studio.adapters.library_errors import LibraryError, NameTaken
from multilora_studio.invalid_setting import InvalidSetting, SettingWord


class Shouted(SettingWord):
    def word(self) -> str:
        return self.name.upper()


def test_the_message_names_the_fields_and_a_face_writes_its_own_words():
    error = InvalidSetting(
        "{adapter!r}: {max_cpu_loras:()} must be >= {max_loras:()}; or raise {max_lora_rank:=}",
        {"max_cpu_loras": 1, "max_loras": 8, "max_lora_rank": 16},
        {"adapter": "a{b}"},
    )
    assert str(error) == "'a{b}': max_cpu_loras (1) must be >= max_loras (8); or raise max_lora_rank=16"
    assert error.fields == ("max_cpu_loras", "max_loras", "max_lora_rank") and error.values["max_loras"] == 8
    shouted = error.render(Shouted)
    assert shouted == "'a{b}': MAX_CPU_LORAS (1) must be >= MAX_LORAS (8); or raise MAX_LORA_RANK=16"
    assert (
        str(InvalidSetting.of("max_loras", 0, "must be >= 1, got {value}")) == "max_loras must be >= 1, got 0"
    )
    with pytest.raises(ValueError, match="written"):
        InvalidSetting("{max_loras:x}", {"max_loras": 1})


def test_refusals_cross_a_process_boundary_whole():
    error = AdapterOverLimit(
        "{where}: rank {rank} exceeds {max_lora_rank:=}", {"max_lora_rank": 16}, {"where": "/a", "rank": 32}
    )
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is AdapterOverLimit and isinstance(again, (AdapterError, InvalidSetting))
    assert str(again) == str(error) == "/a: rank 32 exceeds max_lora_rank=16" and again.values == error.values
    assert str(error.naming("/a", "/b")) == "/b: rank 32 exceeds max_lora_rank=16"
    taken = pickle.loads(pickle.dumps(NameTaken("the name 'x' is taken")))
    assert isinstance(taken, LibraryError) and taken.reason == "the name 'x' is taken"
    assert str(taken) == "the name 'x' is taken; choose another name"
