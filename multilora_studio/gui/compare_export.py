"""A finished (or stopped) comparison as Markdown or JSON, carrying its whole run record (plain Python)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from multilora_studio.run_records import RunRecord, RunSettings


@dataclass(frozen=True)
class Comparison:
    """A run record and, per column name, where its last answer first differs from the base's."""

    record: RunRecord
    differs_from_base_at: dict[str, int | None] = field(default_factory=dict)


def to_json(comparison: Comparison) -> str:
    """The run record (``RunRecord.from_dict`` reads it back) with the differences from the base."""
    data = comparison.record.to_dict()
    data["differs_from_base_at"] = comparison.differs_from_base_at
    return json.dumps(data, indent=2, ensure_ascii=False)


def _number(value: float | None, unit: str, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f} {unit}"


def _settings(settings: RunSettings) -> str:
    stop = ", ".join(repr(s) for s in settings.stop) or "none"
    seed = "random" if settings.seed is None else settings.seed
    return (
        f"max_tokens={settings.max_tokens}, temperature={settings.temperature:g}, top_p={settings.top_p:g}, "
        f"seed={seed}, stop={stop}, ignore_eos={settings.ignore_eos}"
    )


def _fenced(text: str, info: str = "text") -> list[str]:
    fence = "````" if "```" in text else "```"
    return [fence + info, text, fence]


def to_markdown(comparison: Comparison) -> str:
    record = comparison.record
    engine = record.engine
    lines = [
        f"# Comparison on {engine.model_name}",
        "",
        f"{engine.describe()}; run `{record.id}`.",
        "",
        f"Sampling: {_settings(record.shared)}",
        "",
    ]
    if record.system_prompt and not record.raw:
        lines += ["**System prompt**:", "", *_fenced(record.system_prompt), ""]
    for turn, text in enumerate(record.user_turns, 1):
        label = "Prompt (raw)" if record.raw else f"User, turn {turn}"
        lines += [f"**{label}**:", "", *_fenced(text), ""]
    lines += [
        "| column | adapter sha256 | tokens | tok/s | TTFT | queued | finish | differs from base at "
        "| own settings |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | --- |",
    ]
    for column in record.columns:
        output = column.output
        differs = comparison.differs_from_base_at.get(column.name)
        own = "-" if column.overrides.empty else _settings(column.settings)
        digest = f"`{column.adapter_digest[:12]}`" if column.adapter_digest else "-"
        lines.append(
            f"| {column.name} | {digest} | {len(output.token_ids) if output else 0} "
            f"| {_number(output.tokens_per_second if output else None, 'tok/s', 1)} "
            f"| {_number(output.ttft_s if output else None, 's')} "
            f"| {_number(output.queue_s if output else None, 's')} "
            f"| {(output.finish_reason if output else None) or '-'} "
            f"| {'-' if differs is None else f'char {differs}'} | {own} |"
        )
    for column in record.columns:
        lines += ["", f"## {column.name}", "", *_fenced(column.output.text if column.output else "")]
    return "\n".join(lines) + "\n"
