"""What *Merge and export* writes, as plain rules: a Hugging Face model folder (registered as a
base model), the adapter as a GGUF LoRA file, or the merged model as a GGUF file; the path each
suggests, what a GGUF export refuses before it runs, the export itself and its closing message."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

from multilora_studio.merge.export import MergeCancelled
from multilora_studio.merge.gguf_export import (
    QUANTIZE_HINT,
    GGUFExport,
    export_adapter_gguf,
    export_merged_gguf,
)
from multilora_studio.merge.library_merge import MergeInputs
from multilora_studio.util import ProgressCallback

FOLDER = "Merged model as a Hugging Face folder (registered as a base model)"
ADAPTER_GGUF = "Export adapter as GGUF (llama.cpp --lora, Ollama ADAPTER)"
MERGED_GGUF = "Export merged model as GGUF"
OUTPUTS = (FOLDER, ADAPTER_GGUF, MERGED_GGUF)
GGUF_KINDS = ("f16", "bf16", "f32", "q8_0")  # merge.gguf_model.GGUF_TYPES, most used first


def is_gguf(output: str) -> bool:
    """Whether ``output`` writes one GGUF file (rather than a model folder)."""
    return output in (ADAPTER_GGUF, MERGED_GGUF)


def suggested_path(output: str, names: Sequence[str], kind: str, folder: Path) -> Path:
    """Where ``output`` of the adapters ``names`` goes in ``folder`` unless the person picks."""
    stem = "+".join(names).replace("/", "_") or "merged"
    if output == ADAPTER_GGUF:
        return folder / f"{stem}.gguf"
    if output == MERGED_GGUF:
        return folder / f"{stem}-merged-{kind}.gguf"
    return folder / f"{stem}-merged"


def gguf_refusal(chosen: Sequence[tuple[str, float]]) -> str | None:
    """Why a GGUF export of the checked ``(adapter, weight)`` pairs cannot start, or None."""
    if len(chosen) != 1:
        return (
            "Check one adapter: a GGUF export takes one (combine several into a new adapter "
            "first: multilora-studio merge --as-adapter)."
        )
    if chosen[0][1] != 1.0:
        return "A weight applies to combining several adapters; export one adapter at weight 1.0."
    return None


def export_gguf(
    output: str,
    inputs: MergeInputs,
    out: Path,
    kind: str,
    progress: ProgressCallback,
    cancel: threading.Event,
) -> GGUFExport:
    """Write ``output`` (ADAPTER_GGUF or MERGED_GGUF) at ``out``; MergeCancelled once ``cancel``
    is set before anything was written."""
    if output == MERGED_GGUF:
        return export_merged_gguf(inputs, out, kind, progress, cancel)
    if cancel.is_set():
        raise MergeCancelled("the export was cancelled")
    progress(0.5, f"writing {Path(out).name}")
    result = export_adapter_gguf(inputs, out)
    progress(1.0, f"wrote {result.path}")
    return result


def finished_message(output: str, result: GGUFExport, kind: str) -> str:
    """What a finished GGUF export tells: the files written and how llama.cpp and Ollama use them."""
    n = result.size_bytes
    size = f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"
    ollama = f"Ollama: ollama create NAME -f {result.modelfile}."
    if output == ADAPTER_GGUF:
        return (
            f"Wrote {result.path} ({size}) and {result.modelfile}. "
            f"llama.cpp: llama-cli -m BASE.gguf --lora {result.path}. {ollama}"
        )
    hint = QUANTIZE_HINT.format(path=result.path)
    return f"Wrote {result.path} ({size}, {kind}) and {result.modelfile}. {ollama} For {hint}."
