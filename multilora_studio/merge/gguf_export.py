"""Export for llama.cpp and Ollama: one adapter as a GGUF LoRA adapter, or the model merged
with it as a GGUF model, each with an Ollama ``Modelfile`` beside it (``NAME.Modelfile``). The
model card travels as the file's ``general.description``. A file is written as ``NAME.partial``
and renamed into place, so a failure leaves nothing under the name."""

from __future__ import annotations

import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from multilora_studio.adapters.gguf_adapter import GGUFText, write_gguf_adapter
from multilora_studio.adapters.peft_adapter import load_peft_adapter
from multilora_studio.engine.model.model_spec import load_spec
from multilora_studio.merge.export import MergeRequest, merge_and_export
from multilora_studio.merge.gguf_model import GGUF_TYPES, chat_template, write_gguf_model
from multilora_studio.merge.library_merge import MergeInputs
from multilora_studio.merge.merged_weights import MergeError
from multilora_studio.merge.modelfile import modelfile
from multilora_studio.merge.weighted_adapters import MAX_RANK
from multilora_studio.util import ProgressCallback

QUANTIZE_HINT = "other quantizations (Q4_K_M, Q5_K_M, ...): llama.cpp's llama-quantize {path} OUT.gguf Q4_K_M"


@dataclass(frozen=True)
class GGUFExport:
    """The GGUF file written, its size and the Modelfile beside it."""

    path: Path
    size_bytes: int
    modelfile: Path


def export_adapter_gguf(inputs: MergeInputs, out: Path) -> GGUFExport:
    """Write the one adapter of ``inputs`` as a llama.cpp LoRA adapter (float32) at ``out``; its
    Modelfile is FROM the base folder with the adapter as ADAPTER."""
    folder, source = _one_adapter(inputs)
    out = _new_file(out)
    spec = load_spec(inputs.base_folder)
    adapter = load_peft_adapter(
        source.name, folder, spec.num_layers, spec.projection_shape, MAX_RANK, spec.vocab
    )
    card = folder / "README.md"
    text = GGUFText(
        source.name,
        card.read_text(errors="replace")
        if card.is_file()
        else f"LoRA adapter {source.name} of {inputs.base.name}",
        inputs.base.name,
        _repo_url(inputs.base.repo),
    )
    _written(out, lambda partial: write_gguf_adapter(adapter, inputs.base_ref, partial, text))
    return _with_modelfile(
        out, str(inputs.base_folder), chat_template(inputs.base_folder), adapter=f"./{out.name}"
    )


def export_merged_gguf(
    inputs: MergeInputs,
    out: Path,
    kind: str,
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
) -> GGUFExport:
    """Merge ``inputs`` and write the model as a GGUF file of ``kind`` (``GGUF_TYPES``) at ``out``,
    its Modelfile FROM the file."""
    if kind not in GGUF_TYPES:
        raise MergeError(f"GGUF weights are one of {', '.join(GGUF_TYPES)}; {QUANTIZE_HINT.format(path=out)}")
    out = _new_file(out)
    report = progress or (lambda fraction, message: None)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}-merged-") as scratch:
        request = MergeRequest(
            inputs.base_folder,
            inputs.base,
            inputs.adapter_folders,
            inputs.adapters,
            Path(scratch) / "merged",
            torch.float32,
        )
        merged = merge_and_export(request, lambda f, message: report(0.8 * f, message), cancel)
        report(0.8, f"writing {out.name} ({kind})")
        text = GGUFText(
            out.stem, (merged.path / "README.md").read_text(), inputs.base.name, _repo_url(inputs.base.repo)
        )
        _written(out, lambda partial: write_gguf_model(merged.path, partial, kind, text))
        template = chat_template(merged.path)
    report(1.0, f"wrote {out}")
    return _with_modelfile(out, f"./{out.name}", template)


def _one_adapter(inputs: MergeInputs):
    if len(inputs.adapters) != 1:
        raise MergeError("export one adapter as GGUF; combine several into one first (merge --as-adapter)")
    return inputs.adapter_folders[0], inputs.adapters[0]


def _new_file(out: Path) -> Path:
    out = Path(out).expanduser().resolve()
    if out.suffix.lower() != ".gguf":
        raise MergeError(f"{out.name}: name the GGUF file NAME.gguf")
    if out.exists() or out.with_suffix(".Modelfile").exists():
        raise MergeError(f"{out} (or its Modelfile) already exists; choose a new file name")
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


def _written(out: Path, write) -> None:
    partial = out.with_name(out.name + ".partial")
    try:
        write(partial)
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)


def _with_modelfile(out: Path, source: str, template: str, adapter: str | None = None) -> GGUFExport:
    path = out.with_suffix(".Modelfile")
    path.write_text(modelfile(source, template, adapter))
    return GGUFExport(out, out.stat().st_size, path)


def _repo_url(repo: str) -> str:
    return f"https://huggingface.co/{repo}" if repo else ""
