"""Whether the base serving an adapter is a quantized version of the one it was trained on.

A quantized base (an FP8 / AWQ / GPTQ checkpoint, or float weights quantized when the engine
loads them: ``EngineConfig.quantization``) of the same architecture and shapes serves the
adapters validated against its float base, as people serve QLoRA adapters; the library says
so (``AdapterRecord.base_status`` is "quantized", ``serving_note`` names both bases) instead of
treating the other digest as another base. The shapes are checked when the adapter is added.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BaseQuantization:
    """A served base's quantization: the checkpoint's ``quant_method`` (or the one applied at load)."""

    method: str
    at_load: bool = False

    @property
    def label(self) -> str:
        return f"{self.method}, quantized at load" if self.at_load else self.method


def base_quantization_of(folder: Path | None, requested: str | None) -> BaseQuantization | None:
    """The quantization of a base served from ``folder`` (None: random or unknown weights) with
    ``EngineConfig.quantization`` = ``requested``; None for float weights served as they are.
    (Whether the engine serves that quantization is the engine's check, when it loads.)"""
    declared = ""
    config = Path(folder) / "config.json" if folder is not None else None
    if config is not None and config.is_file():
        try:
            quant = json.loads(config.read_text()).get("quantization_config") or {}
        except (OSError, ValueError, AttributeError):
            quant = {}
        declared = str(quant.get("quant_method", "")) if isinstance(quant, dict) else ""
    if declared:
        return BaseQuantization(declared)
    return BaseQuantization(requested, at_load=True) if requested else None


def serving_note(
    adapter: str,
    trained_name: str,
    trained_digest: str,
    base_name: str,
    digest: str,
    quantization: BaseQuantization,
) -> str:
    """What the library says when a quantized base serves an adapter of its float base."""
    return (
        f"adapter {adapter!r} was trained on base {trained_name} (sha256 {trained_digest[:12]}) and is "
        f"served on {base_name} ({quantization.label}, sha256 {digest[:12]})"
    )
