"""What a request's output must match: a JSON schema, any JSON object, a regex, a choice, or a grammar."""

from __future__ import annotations

from dataclasses import dataclass

STRUCTURE_KINDS = ("json_schema", "json_object", "regex", "choice", "lark")


@dataclass(frozen=True)
class StructuredOutput:
    """A constraint on the generated text; exactly one field is set.

    ``json_schema``: JSON Schema text, met strictly; ``json_object``: any JSON object;
    ``regex``: the whole output matches it; ``choice``: the output is one of these strings;
    ``lark``: a grammar in llguidance's Lark dialect (which may embed ``%json {...}`` schemas).
    """

    json_schema: str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    lark: str | None = None

    def __post_init__(self) -> None:
        given = [kind for kind in STRUCTURE_KINDS if getattr(self, kind) not in (None, False)]
        if len(given) != 1:
            kinds = ", ".join(STRUCTURE_KINDS)
            raise ValueError(f"structured output needs exactly one of {kinds}, got {given}")
        if self.choice is not None:
            if not self.choice or any(not isinstance(c, str) or not c for c in self.choice):
                raise ValueError("structured output choice must be a non-empty list of non-empty strings")
            object.__setattr__(self, "choice", tuple(self.choice))

    @property
    def kind(self) -> str:
        """Which constraint this is (one of ``STRUCTURE_KINDS``)."""
        return next(kind for kind in STRUCTURE_KINDS if getattr(self, kind) not in (None, False))

    @property
    def size(self) -> int:
        """Characters of the constraint's text: its schema, pattern, grammar or choices."""
        texts = [self.json_schema, self.regex, self.lark, *(self.choice or ())]
        return sum(len(text) for text in texts if text is not None)
