"""What makes an output pass: exact, contains, regex, JSON schema, or choice by log-likelihood.

A check is written in a prompt set as ``{"type": KIND, ...}`` (or just ``"KIND"`` when it needs
nothing but the row's reference): ``exact`` / ``contains`` compare with ``value`` or the reference
(whitespace at the ends stripped for ``exact``), ``regex`` searches ``pattern`` in the output,
``json_schema`` parses the output as JSON and validates it against ``schema``
(``evaluate/json_schema.py``), ``choice`` picks the most likely of ``choices`` under each adapter
(summed log-probability, ``evaluate/scoring.py``) and passes when that is the reference.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from multilora_studio.evaluate.json_schema import check_schema, schema_errors

CHECK_KINDS = ("exact", "contains", "regex", "json_schema", "choice")
ARGUMENT = {
    "exact": "value",
    "contains": "value",
    "regex": "pattern",
    "json_schema": "schema",
    "choice": "choices",
}


@dataclass(frozen=True)
class Check:
    """One check; ``argument`` is the value, pattern, schema or choices (None: use the reference)."""

    kind: str
    argument: Any = None

    def passes(self, output: str, reference: str | None) -> bool:
        """Whether ``output`` passes (not for ``choice``, which the runner decides from scores)."""
        if self.kind == "exact":
            return output.strip() == self.target(reference).strip()
        if self.kind == "contains":
            return self.target(reference) in output
        if self.kind == "regex":
            return re.search(self.argument, output) is not None
        if self.kind == "json_schema":
            try:
                value = json.loads(output.strip())
            except ValueError:
                return False
            return not schema_errors(value, self.argument)
        raise ValueError(f"a {self.kind} check is decided by the runner's scores, not by the output text")

    def target(self, reference: str | None) -> str:
        text = self.argument if self.argument is not None else reference
        if text is None:
            raise ValueError(f"the {self.kind} check needs a value or a reference")
        return text

    def to_spec(self) -> dict[str, Any]:
        """The form a prompt set writes (``parse_check`` reads it back)."""
        spec: dict[str, Any] = {"type": self.kind}
        if self.argument is not None:
            spec[ARGUMENT[self.kind]] = list(self.argument) if self.kind == "choice" else self.argument
        return spec


def check_spec(spec: Any) -> dict[str, Any]:
    """A check as a dict (a kind name becomes ``{"type": KIND}``); ValueError for an unknown kind."""
    if isinstance(spec, Check):
        return spec.to_spec()
    if isinstance(spec, str):
        spec = {"type": spec}
    if not isinstance(spec, dict) or spec.get("type") not in CHECK_KINDS:
        raise ValueError(f"a check is {{'type': one of {', '.join(CHECK_KINDS)}, ...}}, got {spec!r}")
    return spec


def parse_check(spec: Any, reference: str | None) -> Check:
    """A Check from a prompt set's ``check`` field and the row's reference; ValueError saying why not."""
    spec = check_spec(spec)
    kind = spec["type"]
    key = ARGUMENT[kind]
    extra = sorted(set(spec) - {"type", key})
    if extra:
        raise ValueError(f"a {kind} check takes only {key!r}, not {', '.join(extra)}")
    argument = spec.get(key)
    if kind in ("exact", "contains"):
        if argument is None and reference is None:
            raise ValueError(f"the {kind} check needs a {key!r} or a reference")
        if argument is not None and not isinstance(argument, str):
            raise ValueError(f"a {kind} check's {key!r} must be a string")
    elif kind == "regex":
        if not isinstance(argument, str):
            raise ValueError("a regex check needs a 'pattern' string")
        try:
            re.compile(argument)
        except re.error as error:
            raise ValueError(f"the regex check's pattern {argument!r} is invalid: {error}") from None
    elif kind == "json_schema":
        if argument is None:
            raise ValueError("a json_schema check needs a 'schema'")
        check_schema(argument)
    else:
        if (
            not isinstance(argument, list)
            or len(argument) < 2
            or not all(isinstance(c, str) and c for c in argument)
        ):
            raise ValueError("a choice check needs 'choices': a list of at least two non-empty strings")
        if len(set(argument)) != len(argument):
            raise ValueError("a choice check's choices repeat one another")
        if reference not in argument:
            raise ValueError(f"a choice check needs a reference that is one of its choices {argument}")
        argument = tuple(argument)
    return Check(kind, argument)
