"""The subset of JSON Schema a check may use, checked when the prompt set is read.

Supported keywords: type, properties, required, additionalProperties (true, false or a schema),
items, enum, const, minimum, maximum, minLength, maxLength, minItems, maxItems, pattern, anyOf.
A schema with any other keyword is refused (ValueError naming it), so nothing is silently ignored.
"""

from __future__ import annotations

import re
from typing import Any

KEYWORDS = frozenset(
    {
        "$schema", "title", "description", "type", "properties", "required", "additionalProperties",
        "items", "enum", "const", "minimum", "maximum", "minLength", "maxLength", "minItems",
        "maxItems", "pattern", "anyOf",
    }
)  # fmt: skip
TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


def check_schema(schema: Any, where: str = "schema") -> None:
    """ValueError when ``schema`` uses a keyword or type outside the supported subset."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise ValueError(f"{where} must be a JSON object")
    unknown = sorted(set(schema) - KEYWORDS)
    if unknown:
        raise ValueError(
            f"{where} uses unsupported JSON Schema keywords {', '.join(unknown)}; "
            f"supported: {', '.join(sorted(KEYWORDS - {'$schema', 'title', 'description'}))}"
        )
    types = schema.get("type", [])
    for name in [types] if isinstance(types, str) else types:
        if name not in TYPES:
            raise ValueError(f"{where} has an unknown type {name!r}; one of {', '.join(TYPES)}")
    for key, sub in schema.get("properties", {}).items():
        check_schema(sub, f"{where}.properties.{key}")
    for key in ("items", "additionalProperties"):
        if key in schema:
            check_schema(schema[key], f"{where}.{key}")
    for index, sub in enumerate(schema.get("anyOf", [])):
        check_schema(sub, f"{where}.anyOf[{index}]")
    if "pattern" in schema:
        try:
            re.compile(schema["pattern"])
        except re.error as error:
            raise ValueError(f"{where}.pattern is not a valid regular expression: {error}") from None


def schema_errors(value: Any, schema: Any, path: str = "$") -> list[str]:
    """Why ``value`` does not validate against ``schema`` (empty when it does)."""
    if schema is True:
        return []
    if schema is False:
        return [f"{path}: no value is allowed here"]
    errors: list[str] = []
    if "type" in schema:
        names = [schema["type"]] if isinstance(schema["type"], str) else schema["type"]
        if not any(is_type(value, name) for name in names):
            return [f"{path}: expected {' or '.join(names)}, got {type(value).__name__}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} is not one of {schema['enum']}")
    if "const" in schema and value != schema["const"]:
        errors.append(f"{path}: expected {schema['const']!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path}: {value} < minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path}: {value} > maximum {schema['maximum']}")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            errors.append(f"{path}: shorter than {schema['minLength']}")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{path}: longer than {schema['maxLength']}")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{path}: does not match {schema['pattern']!r}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            errors.append(f"{path}: fewer than {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(f"{path}: more than {schema['maxItems']} items")
        if "items" in schema:
            for index, item in enumerate(value):
                errors += schema_errors(item, schema["items"], f"{path}[{index}]")
    if isinstance(value, dict):
        errors += [f"{path}: missing {key!r}" for key in schema.get("required", []) if key not in value]
        properties = schema.get("properties", {})
        for key, item in value.items():
            if key in properties:
                errors += schema_errors(item, properties[key], f"{path}.{key}")
            elif "additionalProperties" in schema:
                errors += schema_errors(item, schema["additionalProperties"], f"{path}.{key}")
    if "anyOf" in schema and all(schema_errors(value, sub, path) for sub in schema["anyOf"]):
        errors.append(f"{path}: matches none of anyOf")
    return errors


def is_type(value: Any, name: str) -> bool:
    """JSON's types: booleans are not numbers; 1.0 is an integer."""
    if name in ("integer", "number") and isinstance(value, bool):
        return False
    if name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, TYPES[name])
