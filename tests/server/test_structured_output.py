"""Structured output through the API (tiny model): response_format and vLLM's guided_* fields,
and their 400s. Real clients against the embedded model: tests/server/test_structured_clients.py."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

from tests.server_fixtures import client

SCHEMA = {
    "type": "object",
    "properties": {
        "size": {"enum": ["s", "m", "l"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["size", "count"],
    "additionalProperties": False,
}
CHAT = [{"role": "user", "content": "Describe the box."}]


def test_chat_response_format_json_schema_is_met(serve, engine):
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "box", "schema": SCHEMA, "strict": True},
    }
    response = client(serve()).chat.completions.create(
        model=engine.model_name, messages=CHAT, temperature=0, max_tokens=60, response_format=response_format
    )
    choice = response.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_n_choices_each_follow_the_schema(serve, engine):
    response_format = {"type": "json_schema", "json_schema": {"name": "box", "schema": SCHEMA}}
    response = client(serve()).chat.completions.create(
        model="tiny-r8-all", messages=CHAT, n=4, seed=5, max_tokens=60, response_format=response_format
    )
    assert len(response.choices) == 4
    for choice in response.choices:
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)


@pytest.mark.parametrize(
    ("extra", "check"),
    [
        ({"guided_regex": r"[a-z]{3}-[0-9]{2}"}, lambda t: re.fullmatch(r"[a-z]{3}-[0-9]{2}", t)),
        ({"guided_choice": ["left", "right"]}, lambda t: t in ("left", "right")),
        ({"guided_json": json.dumps(SCHEMA)}, lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
        ({"guided_json": SCHEMA}, lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
        ({"guided_grammar": 'start: "v" /[0-9]/ "." /[0-9]/'}, lambda t: re.fullmatch(r"v\d\.\d", t)),
        ({"guided_grammar": 'root ::= "v" [0-9] "." [0-9]'}, lambda t: re.fullmatch(r"v\d\.\d", t)),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "b", "schema": SCHEMA}}},
            lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None,
        ),
    ],
    ids=["regex", "choice", "json_text", "json_object", "lark", "gbnf", "response_format"],
)
def test_completions_honour_each_constraint_field(serve, engine, extra, check):
    response = client(serve()).completions.create(
        model=engine.model_name, prompt="Value:", temperature=0, max_tokens=60, extra_body=extra
    )
    choice = response.choices[0]
    assert choice.finish_reason == "stop", choice.text
    assert check(choice.text), choice.text


def test_streamed_constrained_chat_adds_up_to_a_match(serve, engine):
    stream = client(serve()).chat.completions.create(
        model=engine.model_name,
        messages=CHAT,
        max_tokens=40,
        temperature=0,
        stream=True,
        extra_body={"guided_regex": r"(yes|no), [a-z]{4}"},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert re.fullmatch(r"(yes|no), [a-z]{4}", text)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_text_response_format_is_free_text(serve, engine):
    plain = client(serve()).chat.completions.create(
        model=engine.model_name, messages=CHAT, temperature=0, max_tokens=8
    )
    text = client(serve()).chat.completions.create(
        model=engine.model_name, messages=CHAT, temperature=0, max_tokens=8, response_format={"type": "text"}
    )
    assert text.choices[0].message.content == plain.choices[0].message.content


@pytest.mark.parametrize(
    ("extra", "param", "message"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "objekt"}},
                }
            },
            "response_format",
            "objekt",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format",
            "schema",
        ),
        ({"response_format": {"type": "xml"}}, "response_format", "xml"),
        ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
        ({"guided_json": "[1, 2]"}, "guided_json", "JSON object"),
        ({"guided_regex": "[a-z"}, "guided_regex", "unclosed"),
        ({"guided_choice": ["a", ""]}, "guided_choice", "non-empty"),
        ({"guided_grammar": "start: nowhere"}, "guided_grammar", "nowhere"),
        ({"guided_regex": "a+", "guided_choice": ["a"]}, "guided_choice", "give one"),
        ({"response_format": {"type": "json_object"}, "guided_regex": "a+"}, "guided_regex", "give one"),
        # byte 0xF2 (the first of U+88433's four) has no token in this tokenizer
        ({"guided_choice": ["ok", "\U00088433"]}, "guided_choice", "no token of this model's tokenizer"),
    ],
    ids=[
        "bad_schema",
        "no_schema",
        "bad_type",
        "json_text",
        "json_array",
        "regex",
        "choice",
        "grammar",
        "two_guided",
        "format_and_guided",
        "unwritable_choice",
    ],
)
@pytest.mark.parametrize("route", ["chat", "completions"])
def test_bad_constraints_are_400s_naming_the_field(serve, engine, extra, param, message, route):
    api = client(serve())
    with pytest.raises(openai.BadRequestError) as caught:
        if route == "chat":
            api.chat.completions.create(
                model=engine.model_name, messages=CHAT, max_tokens=4, extra_body=extra
            )
        else:
            api.completions.create(model=engine.model_name, prompt="x", max_tokens=4, extra_body=extra)
    error = caught.value.body
    assert error["param"] == param
    assert message in error["message"]
    # the engine keeps serving
    assert (
        api.completions.create(model=engine.model_name, prompt="x", max_tokens=2).choices[0].text is not None
    )


def test_a_grammar_the_tokens_cannot_follow_is_a_400_and_the_engine_goes_on(serve, engine):
    """A regex whose only match needs a byte no token holds compiles, then refuses every token
    the model could write: the request ends with a 400 that says so, not a server error."""
    api = client(serve())
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(
            model=engine.model_name, messages=CHAT, max_tokens=4, extra_body={"guided_regex": "\U00088433"}
        )
    assert caught.value.body["message"].startswith("structured output failed")
    assert (
        api.completions.create(model=engine.model_name, prompt="x", max_tokens=2).choices[0].text is not None
    )
