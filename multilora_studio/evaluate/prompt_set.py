"""Prompt sets from JSONL or CSV files: each row a prompt, an optional reference and check.

JSONL: one JSON object a line, with ``prompt`` (text) or ``messages`` (chat messages, each with
string ``role`` and ``content``), optional ``reference`` (text) and ``check`` (``evaluate/checks.py``);
a first line of only ``{"default_check": CHECK}`` sets the check of rows that give none.
Blank lines are skipped. CSV: a header with ``prompt`` and optional ``reference``, ``check``
(a kind) and ``check_value`` (the value or pattern; a JSON schema or a JSON list of choices).
Errors name the file and the row (the line number of JSONL, the record number of CSV after the
header).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multilora_studio.evaluate.checks import ARGUMENT, Check, check_spec, parse_check

JSONL_FIELDS = frozenset({"prompt", "messages", "reference", "check"})
CSV_FIELDS = ("prompt", "reference", "check", "check_value")
Prompt = str | list[dict[str, str]]


@dataclass(frozen=True)
class PromptCase:
    """One row: ``row`` is where it stands in the file (line of JSONL, record of CSV)."""

    row: int
    prompt: Prompt
    reference: str | None = None
    check: Check | None = None

    @property
    def prompt_text(self) -> str:
        """The prompt as one line of text (chat messages as JSON)."""
        return self.prompt if isinstance(self.prompt, str) else json.dumps(self.prompt, ensure_ascii=False)


@dataclass(frozen=True)
class PromptSet:
    """The rows of one file; ``digest`` is the SHA-256 of its bytes.

    ``path`` is the file (absolute), ``default_check`` the default it was read with (None: the
    file's own), what a rerun reads it again with.
    """

    name: str
    digest: str
    cases: tuple[PromptCase, ...]
    path: str = ""
    default_check: dict[str, Any] | None = None


def load_prompt_set(path: Path, default_check: Check | str | dict[str, Any] | None = None) -> PromptSet:
    """Read a .jsonl or .csv prompt set; ``default_check`` (else the file's) is for rows without one.

    The default is a Check or a check as a file writes it (a kind name or a JSON object); it
    is checked against each row it applies to (an ``exact`` default needs each row's reference).
    """
    path = Path(path).expanduser()
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path} is not UTF-8 text (byte {error.start})") from None
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".csv"):
        raise ValueError(f"{path}: a prompt set is a .jsonl or .csv file")
    try:
        rows = list(_jsonl_rows(text) if suffix == ".jsonl" else _csv_rows(text))
    except ValueError as error:
        raise ValueError(f"{path}, {error}") from None
    default = None
    if rows and set(rows[0][1]) == {"default_check"}:
        row, fields = rows.pop(0)
        default = _at(path, row, lambda: check_spec(fields["default_check"]))
    given = None if default_check is None else check_spec(default_check)
    if given is not None:
        default = given
    cases = tuple(_at(path, row, lambda f=fields, r=row: _case(r, f, default)) for row, fields in rows)
    if not cases:
        raise ValueError(f"{path} has no prompts")
    return PromptSet(path.stem, hashlib.sha256(data).hexdigest(), cases, str(path.resolve()), given)


def _at(path: Path, row: int, build: Any) -> Any:
    try:
        return build()
    except ValueError as error:
        raise ValueError(f"{path}, row {row}: {error}") from None


def _jsonl_rows(text: str) -> Iterator[tuple[int, dict[str, Any]]]:
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            fields = json.loads(line)
        except ValueError as error:
            raise ValueError(f"row {number}: not valid JSON ({error})") from None
        if not isinstance(fields, dict):
            raise ValueError(f"row {number}: each line is a JSON object")
        yield number, fields


def _csv_rows(text: str) -> Iterator[tuple[int, dict[str, Any]]]:
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None or "prompt" not in header:
        raise ValueError(f"row 1: the CSV header needs a 'prompt' column (columns: {', '.join(CSV_FIELDS)})")
    unknown = [name for name in header if name not in CSV_FIELDS]
    if unknown or len(set(header)) != len(header):
        raise ValueError(
            f"row 1: unknown or repeated columns {unknown or header}; use {', '.join(CSV_FIELDS)}"
        )
    for number, record in enumerate(reader, start=1):
        if not any(cell.strip() for cell in record):
            continue
        if len(record) != len(header):
            raise ValueError(f"row {number}: {len(record)} cells, the header has {len(header)}")
        cells = {name: value for name, value in zip(header, record, strict=True) if value != ""}
        fields: dict[str, Any] = {key: cells[key] for key in ("prompt", "reference") if key in cells}
        if "check" in cells:
            fields["check"] = _csv_check(number, cells["check"], cells.get("check_value"))
        elif "check_value" in cells:
            raise ValueError(f"row {number}: check_value without a check")
        yield number, fields


def _csv_check(number: int, kind: str, value: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"type": kind}
    if value is None:
        return spec
    if kind in ("json_schema", "choice"):
        try:
            spec[ARGUMENT[kind]] = json.loads(value)
        except ValueError as error:
            raise ValueError(f"row {number}: check_value of a {kind} check is JSON ({error})") from None
    else:
        spec[ARGUMENT.get(kind, "value")] = value
    return spec


def _case(row: int, fields: dict[str, Any], default: Any) -> PromptCase:
    unknown = sorted(set(fields) - JSONL_FIELDS)
    if unknown:
        raise ValueError(f"unknown fields {', '.join(unknown)}; a row has {', '.join(sorted(JSONL_FIELDS))}")
    if ("prompt" in fields) == ("messages" in fields):
        raise ValueError("a row has either 'prompt' (text) or 'messages' (chat), not both or neither")
    prompt: Prompt = fields["prompt"] if "prompt" in fields else fields["messages"]
    if "prompt" in fields and (not isinstance(prompt, str) or not prompt.strip()):
        raise ValueError("'prompt' must be non-empty text")
    if "messages" in fields:
        _check_messages(prompt)
    reference = fields.get("reference")
    if reference is not None and not isinstance(reference, str):
        raise ValueError("'reference' must be text")
    spec = fields.get("check", default)  # the file's default check must fit this row too
    check = parse_check(spec, reference) if spec is not None else None
    return PromptCase(row, prompt, reference, check)


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list of chat messages")
    for message in messages:
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            raise ValueError("each chat message is {'role': TEXT, 'content': TEXT}")
