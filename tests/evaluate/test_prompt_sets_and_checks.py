"""Prompt sets from JSONL and CSV, every check kind passing and failing, row-numbered errors."""

from __future__ import annotations

import json

import pytest

from multilora_studio.evaluate import Check, load_prompt_set
from multilora_studio.evaluate.checks import parse_check
from multilora_studio.evaluate.json_schema import schema_errors
from tests.evaluate.conftest import write_jsonl

ARRAY = {"type": "array", "items": {"enum": [1, 2]}}
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "minLength": 1}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("spec", "reference", "output", "expected"),
    [
        ("exact", "Paris", "  Paris\n", True),
        ("exact", "Paris", "Paris, France", False),
        ({"type": "exact", "value": "42"}, None, "42", True),
        ("contains", "Paris", "It is Paris.", True),
        ("contains", "Paris", "It is paris.", False),
        ({"type": "regex", "pattern": r"^\d{3}-\d{4}$"}, None, "555-1234", True),
        ({"type": "regex", "pattern": r"^\d{3}-\d{4}$"}, None, "call 555-1234", False),
        ({"type": "json_schema", "schema": SCHEMA}, None, ' {"name": "Ada", "age": 36} ', True),
        ({"type": "json_schema", "schema": SCHEMA}, None, '{"name": "Ada", "age": -1}', False),
        ({"type": "json_schema", "schema": SCHEMA}, None, '{"age": 3}', False),
        ({"type": "json_schema", "schema": SCHEMA}, None, '{"name": "Ada", "x": 1}', False),
        ({"type": "json_schema", "schema": SCHEMA}, None, "{name: Ada}", False),
        ({"type": "json_schema", "schema": ARRAY}, None, "[1, 2, 1]", True),
        ({"type": "json_schema", "schema": ARRAY}, None, "[1, 3]", False),
        ({"type": "json_schema", "schema": {"type": "integer"}}, None, "true", False),
        ({"type": "json_schema", "schema": {"anyOf": [{"type": "null"}, {"const": "x"}]}}, None, '"x"', True),
    ],
)  # fmt: skip
def test_each_check_passes_and_fails_where_it_should(spec, reference, output, expected):
    assert parse_check(spec, reference).passes(output, reference) is expected


@pytest.mark.parametrize(
    ("spec", "reference", "message"),
    [
        ("exact", None, "the exact check needs a 'value' or a reference"),
        ({"type": "regex", "pattern": "(unclosed"}, None, "is invalid"),
        ({"type": "json_schema", "schema": {"oneOf": []}}, None, "unsupported JSON Schema keywords oneOf"),
        ({"type": "json_schema", "schema": {"type": "map"}}, None, "unknown type 'map'"),
        ({"type": "choice", "choices": ["a", "b"]}, "c", "reference that is one of its choices"),
        ({"type": "choice", "choices": ["a"]}, "a", "at least two"),
        ({"type": "contains", "pattern": "x"}, "x", "takes only 'value'"),
        ({"type": "fuzzy"}, "x", "a check is"),
    ],
)  # fmt: skip
def test_bad_checks_are_refused_with_the_reason(spec, reference, message):
    with pytest.raises(ValueError, match=message):
        parse_check(spec, reference)


def test_schema_errors_say_where(tmp_path):
    assert schema_errors({"name": 3}, SCHEMA) == ["$.name: expected string, got int"]


def test_jsonl_with_text_chat_references_and_a_file_default_check(tmp_path):
    path = write_jsonl(
        tmp_path / "set.jsonl",
        [
            {"default_check": "contains"},
            {"prompt": "Say hi", "reference": "hi"},
            {"messages": [{"role": "user", "content": "Yes or no?"}], "reference": "yes",
             "check": {"type": "choice", "choices": ["yes", "no"]}},
            {"prompt": "Anything", "check": {"type": "regex", "pattern": "."}},
        ],
    )  # fmt: skip
    path.write_text(path.read_text() + "\n\n")  # blank lines are skipped
    loaded = load_prompt_set(path)
    assert loaded.name == "set" and len(loaded.digest) == 64
    first, chat, bare = loaded.cases
    assert (first.row, first.prompt, first.check) == (2, "Say hi", Check("contains"))
    assert chat.prompt == [{"role": "user", "content": "Yes or no?"}]
    assert chat.check == Check("choice", ("yes", "no"))
    assert bare.row == 4 and bare.check == Check("regex", ".")
    overridden = load_prompt_set(path, default_check=Check("exact", "hi"))
    assert overridden.cases[0].check == Check("exact", "hi")
    assert overridden.cases[2].check == Check("regex", ".")  # a row's own check wins


def test_the_default_check_must_fit_each_row(tmp_path):
    path = write_jsonl(
        tmp_path / "set.jsonl",
        [{"default_check": "exact"}, {"prompt": "a", "reference": "b"}, {"prompt": "c"}],
    )
    with pytest.raises(ValueError, match=r"set.jsonl, row 3: the exact check needs"):
        load_prompt_set(path)


def test_csv_with_checks_schema_and_choices(tmp_path):
    path = tmp_path / "set.csv"
    path.write_text(
        "prompt,reference,check,check_value\n"
        'Capital of France?,Paris,contains,\n'
        'Give JSON,,json_schema,"{""type"": ""object""}"\n'
        'Pick,no,choice,"[""yes"", ""no""]"\n'
        'Phone?,,regex,\\d+\n'
        ",,,\n"
        "Free text,,,\n"
    )  # fmt: skip
    cases = load_prompt_set(path).cases
    assert [case.row for case in cases] == [1, 2, 3, 4, 6]
    assert cases[0].check == Check("contains") and cases[0].reference == "Paris"
    assert cases[1].check == Check("json_schema", {"type": "object"})
    assert cases[2].check == Check("choice", ("yes", "no"))
    assert cases[3].check == Check("regex", r"\d+")
    assert cases[4].check is None and cases[4].reference is None


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("a.jsonl", '{"prompt": "ok"}\n{"prompt": "broken"\n', r"a.jsonl, row 2: not valid JSON"),
        ("a.jsonl", '{"prompt": "ok"}\n\n["a list"]\n', r"row 3: each line is a JSON object"),
        ("a.jsonl", '{"prompt": "ok"}\n{"text": "x"}\n', r"row 2: unknown fields text"),
        ("a.jsonl", '{"prompt": "ok", "messages": []}\n', r"row 1: a row has either 'prompt'"),
        ("a.jsonl", '{"messages": [{"role": "user"}]}\n', r"row 1: each chat message"),
        ("a.jsonl", '{"prompt": "x", "reference": 3}\n', r"row 1: 'reference' must be text"),
        ("a.jsonl", '{"prompt": "x", "check": {"type": "regex"}}\n', r"row 1: a regex check needs"),
        ("a.jsonl", "\n\n", r"has no prompts"),
        ("a.csv", "text,reference\nx,y\n", r"a.csv, row 1: the CSV header needs a 'prompt'"),
        ("a.csv", "prompt,extra\nx,y\n", r"row 1: unknown or repeated columns \['extra'\]"),
        ("a.csv", "prompt,reference\nx,y\nz\n", r"a.csv, row 2: 1 cells, the header has 2"),
        (
            "a.csv",
            'prompt,check,check_value\nx,choice,"[1,"\n',
            r"row 1: check_value of a choice check is JSON",
        ),
        ("a.txt", "hello", r"a .jsonl or .csv file"),
    ],
)
def test_malformed_files_name_the_row(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_prompt_set(path)


def test_a_missing_file_is_a_file_not_found_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_prompt_set(tmp_path / "nope.jsonl")


def test_check_specs_round_trip():
    for check in (
        Check("exact"),
        Check("regex", "a+"),
        Check("json_schema", SCHEMA),
        Check("choice", ("a", "b")),
    ):
        spec = json.loads(json.dumps(check.to_spec()))
        assert parse_check(spec, "a") == check
