"""The request fields that constrain the output (``response_format``, vLLM's ``guided_*``) as a
``StructuredOutput``, checked here so a bad schema or grammar is a 400 naming its field."""

from __future__ import annotations

import json
from typing import Any

from multilora_studio.engine import StructuredOutput
from multilora_studio.engine.sampling.grammar import as_lark, check_structured
from multilora_studio.server.errors import ApiError
from multilora_studio.server.schemas import ChatCompletionRequest, CompletionRequest

GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
# the field a structured-output kind comes from (a JSON schema from response_format unless guided_json)
FIELD_OF_KIND = {"choice": "guided_choice", "regex": "guided_regex", "lark": "guided_grammar"}
RESPONSE_FORMATS = ("text", "json_object", "json_schema")


def _invalid(field: str, message: str) -> ApiError:
    return ApiError(400, f"{field}: {message}", "invalid_value", field)


def _schema_text(field: str, schema: Any) -> str:
    """A JSON schema given as an object (or, for guided_json, as JSON text) as JSON text."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as error:
            raise _invalid(field, f"the JSON schema is not valid JSON: {error}") from None
    if not isinstance(schema, dict):
        raise _invalid(field, "the JSON schema must be a JSON object")
    return json.dumps(schema)


def _from_response_format(value: dict[str, Any]) -> StructuredOutput | None:
    kind = value.get("type", "text")
    if kind not in RESPONSE_FORMATS:
        raise _invalid("response_format", f"type must be one of {', '.join(RESPONSE_FORMATS)}, got {kind!r}")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput(json_object=True)
    described = value.get("json_schema")
    if not isinstance(described, dict) or not isinstance(described.get("schema"), dict):
        raise _invalid("response_format", "type json_schema needs json_schema.schema, a JSON schema object")
    # "strict" changes nothing: every schema is enforced
    return StructuredOutput(json_schema=json.dumps(described["schema"]))


def structure_field(spec: StructuredOutput) -> str:
    """The request field a compiled ``spec`` most likely came from, for an engine error about it."""
    return FIELD_OF_KIND.get(spec.kind, "response_format")


def _from_guided(field: str, value: Any) -> StructuredOutput:
    if field == "guided_json":
        return StructuredOutput(json_schema=_schema_text(field, value))
    if field == "guided_regex":
        return StructuredOutput(regex=value)
    if field == "guided_choice":
        return StructuredOutput(choice=tuple(value))
    try:
        return StructuredOutput(lark=as_lark(value))
    except ValueError as error:
        raise _invalid(field, str(error)) from None


def requested_structure(body: CompletionRequest | ChatCompletionRequest) -> StructuredOutput | None:
    """The output constraint the request asks for (None: free text); at most one field may ask."""
    given = [name for name in GUIDED_FIELDS if getattr(body, name) is not None]
    if body.response_format is not None and body.response_format.get("type", "text") != "text":
        given.insert(0, "response_format")
    if len(given) > 1:
        raise _invalid(given[1], f"{given[0]} and {given[1]} both constrain the output; give one of them")
    if not given:
        return None
    field = given[0]
    try:
        if field == "response_format":
            spec = _from_response_format(body.response_format or {})
        else:
            spec = _from_guided(field, getattr(body, field))
        if spec is not None:
            check_structured(spec)
    except ValueError as error:
        raise _invalid(field, str(error)) from None
    return spec
