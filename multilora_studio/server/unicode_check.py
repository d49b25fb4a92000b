"""Request bodies hold valid Unicode only: JSON's ``"\\ud800"`` (a lone surrogate) is a 400 naming the field.

Python decodes such escapes into strings no tokenizer or encoder can take; refusing them while
the body is validated keeps the tokenizers' internals out of the answer.
"""

from __future__ import annotations

from typing import Any

from pydantic_core import PydanticCustomError

INVALID_UNICODE = "invalid_unicode"  # the validation error type; errors.py answers it naming ``field``


def _bad_string(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _first_bad(value: Any, path: tuple[str, ...]) -> tuple[str, ...] | None:
    if isinstance(value, str):
        return path if _bad_string(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and _bad_string(key):
                return (*path, "<key>")
            found = _first_bad(item, (*path, str(key)))
            if found is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _first_bad(item, (*path, str(index)))
            if found is not None:
                return found
    return None


def refuse_invalid_unicode(data: Any) -> Any:
    """``data`` unchanged, or a validation error naming the first field with a lone surrogate."""
    found = _first_bad(data, ())
    if found is not None:
        field = ".".join(found) or "body"
        raise PydanticCustomError(
            INVALID_UNICODE, "{field} is not valid Unicode (it holds a lone surrogate)", {"field": field}
        )
    return data
