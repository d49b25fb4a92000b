"""The README.md of a merged model: which base and which adapters it was made from, and how."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class BaseSource:
    """The base a merge started from (``repo`` and ``revision`` are "" for a local folder)."""

    name: str
    repo: str
    revision: str
    digest: str


@dataclass(frozen=True)
class AdapterSource:
    """One adapter merged in, with its weight (1.0 for a single adapter)."""

    name: str
    source: str  # a Hub repo id or the folder it was imported from
    revision: str
    digest: str  # SHA-256 of its adapter_model.safetensors
    rank: int
    targets: tuple[str, ...]
    kind: str  # AdapterConfig.kind; the vocabulary side after a comma
    weight: float = 1.0


def model_card(
    title: str,
    base: BaseSource,
    adapters: Sequence[AdapterSource],
    combination: str | None,
    dtype: str,
    created: str,
    version: str,
) -> str:
    """Markdown with a YAML header (``base_model``, tags) that the Hub and transformers read."""
    header = [
        "---",
        f"base_model: {json.dumps(base.repo or base.name)}",
        "library_name: transformers",
        "tags:",
        "- merged",
        "- lora",
        "- multilora-studio",
        "---",
        "",
        f"# {title}",
        "",
        f"The base model with {'the adapter' if len(adapters) == 1 else f'{len(adapters)} adapters'} "
        "merged into its weights (W' = W + B A per trained projection), computed in float32 and "
        f"cast once to {dtype}, by MultiLoRA Studio {version} on {created}.",
        "",
        "## Base",
        "",
        f"- name: {base.name}",
        f"- repository: {base.repo or '(local folder)'}",
        f"- revision: {base.revision or '(unknown)'}",
        f"- weights SHA-256: {base.digest or '(unknown)'}",
        "",
        "## Adapters",
        "",
    ]
    if combination is not None:
        header += [f"Combined first as PEFT's add_weighted_adapter `{combination}` does.", ""]
    header.append("| name | source | revision | kind | rank | targets | weight | SHA-256 |")
    header.append("|---|---|---|---|---|---|---|---|")
    for item in adapters:
        header.append(
            f"| {item.name} | {item.source} | {item.revision or '-'} | {item.kind} | {item.rank} "
            f"| {', '.join(item.targets)} | {item.weight:g} | {item.digest} |"
        )
    return "\n".join(header) + "\n"
