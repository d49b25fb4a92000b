"""A finished (or stopped) comparison as Markdown or JSON (plain Python)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ColumnResult:
    name: str
    text: str
    tokens: int
    finish_reason: str | None
    ttft_s: float | None
    tokens_per_second: float | None
    differs_from_base_at: int | None


@dataclass(frozen=True)
class Comparison:
    model: str
    prompt: str
    chat: bool
    sampling: dict[str, Any]
    columns: list[ColumnResult]


def to_json(comparison: Comparison) -> str:
    return json.dumps(
        {
            "model": comparison.model,
            "prompt": comparison.prompt,
            "chat": comparison.chat,
            "sampling": comparison.sampling,
            "outputs": [column.__dict__ for column in comparison.columns],
        },
        indent=2,
        ensure_ascii=False,
    )


def _number(value: float | None, unit: str, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f} {unit}"


def to_markdown(comparison: Comparison) -> str:
    sampling = ", ".join(f"{key}={value}" for key, value in comparison.sampling.items())
    lines = [
        f"# Comparison on {comparison.model}",
        "",
        f"**Prompt** ({'chat' if comparison.chat else 'raw'}): {comparison.prompt}",
        "",
        f"Sampling: {sampling}",
        "",
        "| adapter | tokens | tok/s | TTFT | finish | differs from base at |",
        "| --- | ---: | ---: | ---: | --- | ---: |",
    ]
    for column in comparison.columns:
        differs = "-" if column.differs_from_base_at is None else f"char {column.differs_from_base_at}"
        lines.append(
            f"| {column.name} | {column.tokens} | {_number(column.tokens_per_second, 'tok/s')} "
            f"| {_number(column.ttft_s, 'ms', 1000, 0)} | {column.finish_reason or '-'} | {differs} |"
        )
    for column in comparison.columns:
        fence = "````" if "```" in column.text else "```"
        lines += ["", f"## {column.name}", "", fence + "text", column.text, fence]
    return "\n".join(lines) + "\n"
