"""A ``StructuredOutput`` as llguidance grammar text, and the check that it is valid (no tokenizer needed)."""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING

import llguidance
from llguidance.gbnf_to_lark import any_to_lark

from multilora_studio.engine.errors import InvalidRequest
from multilora_studio.engine.sampling.grammar.byte_cache import ByteBoundedCache
from multilora_studio.engine.sampling.structured import StructuredOutput

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # the stub's type of the JSON options

# JSON is written on one line with json.dumps' separators ({"a": 1, "b": [2, 3]}); no other
# whitespace is allowed, so a model cannot spend its tokens on blank lines between two keys.
# A schema's own "x-guidance" options override these.
JSON_OPTIONS: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
ANY_OBJECT = '{"type": "object"}'

_WHAT = {
    "json_schema": "JSON schema",
    "json_object": "JSON object",
    "regex": "regex",
    "choice": "choice",
    "lark": "Lark grammar",
}


def _json_grammar(schema: str) -> str:
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    except ValueError as error:
        raise ValueError(f"the JSON schema is not a JSON object: {error}") from None


def grammar_text(spec: StructuredOutput) -> str:
    """The llguidance grammar of ``spec`` (not yet validated); ValueError for a schema that is not JSON."""
    if spec.json_schema is not None:
        return _json_grammar(spec.json_schema)
    if spec.json_object:
        return _json_grammar(ANY_OBJECT)
    if spec.regex is not None:
        return llguidance.LLMatcher.grammar_from_regex(spec.regex)
    if spec.choice is not None:
        return llguidance.grammar_from("choice", json.dumps(list(spec.choice)))
    assert spec.lark is not None
    return llguidance.LLMatcher.grammar_from_lark(spec.lark)


def lark_json(schema: dict) -> str:
    """``schema`` as a Lark ``%json {...}`` item, written the way ``json_schema`` outputs are
    (``JSON_OPTIONS``; the schema's own "x-guidance" options win): for grammars that embed JSON."""
    options = {**JSON_OPTIONS, **schema.get("x-guidance", {})}
    return "%json " + json.dumps({**schema, "x-guidance": options})


def as_lark(grammar: str) -> str:
    """A grammar in Lark syntax, or in llama.cpp's GBNF converted to it (ValueError if neither)."""
    try:
        return any_to_lark(grammar)
    except Exception as error:  # the converter raises whatever its parser met
        raise ValueError(f"invalid grammar (neither Lark nor GBNF): {error}") from None


def invalid(spec: StructuredOutput, detail: str) -> InvalidRequest:
    """The error for an invalid ``spec``: what kind of constraint it is and llguidance's reason."""
    return InvalidRequest(f"invalid {_WHAT[spec.kind]} for structured output: {detail.strip()}", "structured")


# Specs found valid, kept (by their text) up to this many bytes: a request that repeats one is
# not validated again.
CHECKED_SPEC_BYTES = 16 << 20
checked_specs: ByteBoundedCache[StructuredOutput, bool] = ByteBoundedCache(CHECKED_SPEC_BYTES)
checked_lock = threading.Lock()


def check_structured(spec: StructuredOutput) -> None:
    """Raise ValueError unless ``spec`` compiles (checked without a tokenizer, so special tokens
    a Lark grammar names are checked only when the engine compiles it for its tokenizer)."""
    with checked_lock:
        if checked_specs.get(spec):
            return
    try:
        grammar = grammar_text(spec)
    except ValueError as error:
        raise invalid(spec, str(error)) from None
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, None)
    if is_error:
        raise invalid(spec, messages[0])
    with checked_lock:
        checked_specs.put(spec, True, spec.size)
