"""The Merge and export dialog's outputs without a window: suggested paths, what a GGUF export
refuses before it runs, and the GGUF exports of the tiny model read back with ``gguf``."""

from __future__ import annotations

import threading
from pathlib import Path

import gguf
import pytest

from multilora_studio.adapters.adapter_files import AdapterError
from multilora_studio.gui.workflows.merge_outputs import (
    ADAPTER_GGUF,
    FOLDER,
    MERGED_GGUF,
    export_gguf,
    finished_message,
    gguf_refusal,
    suggested_path,
)
from multilora_studio.merge.export import MergeCancelled
from multilora_studio.merge.library_merge import resolve_merge_inputs
from tests.fixtures import AdapterSpec, build_adapter

DORA = AdapterSpec("tiny-dora", 4, 8, ("q_proj", "v_proj"), 41, (("use_dora", True),))


def inputs_of(registry, adapter: Path, base: Path):
    return resolve_merge_inputs(registry, [str(adapter)], [1.0], str(base), False)


def general_type(path: Path) -> str:
    return gguf.GGUFReader(str(path)).fields["general.type"].contents()


def test_each_output_suggests_its_own_path():
    folder = Path("/models")
    assert suggested_path(FOLDER, ["a", "b/c"], "f16", folder) == folder / "a+b_c-merged"
    assert suggested_path(ADAPTER_GGUF, ["a"], "f16", folder) == folder / "a.gguf"
    assert suggested_path(MERGED_GGUF, ["a"], "q8_0", folder) == folder / "a-merged-q8_0.gguf"
    assert suggested_path(ADAPTER_GGUF, [], "f16", folder) == folder / "merged.gguf"


def test_a_gguf_export_takes_one_adapter_at_weight_one():
    assert "Check one adapter" in gguf_refusal([])
    assert "Check one adapter" in gguf_refusal([("a", 1.0), ("b", 1.0)])
    assert "weight 1.0" in gguf_refusal([("a", 0.5)])
    assert gguf_refusal([("a", 1.0)]) is None


def test_adapter_export_writes_a_gguf_lora_and_its_modelfile(
    registry, tiny_adapters, tiny_model_dir, tmp_path
):
    inputs = inputs_of(registry, tiny_adapters["tiny-r4-qv"], tiny_model_dir)
    reports: list[tuple[float, str]] = []
    out = tmp_path / "qv.gguf"
    result = export_gguf(
        ADAPTER_GGUF, inputs, out, "f16", lambda f, m: reports.append((f, m)), threading.Event()
    )
    assert result.path == out.resolve() and general_type(out) == "adapter"
    assert f"ADAPTER ./{out.name}" in result.modelfile.read_text()
    assert reports[-1][0] == 1.0
    message = finished_message(ADAPTER_GGUF, result, "f16")
    assert str(result.path) in message and str(result.modelfile) in message and "--lora" in message

    cancel = threading.Event()
    cancel.set()
    with pytest.raises(MergeCancelled):
        export_gguf(ADAPTER_GGUF, inputs, tmp_path / "never.gguf", "f16", lambda f, m: None, cancel)
    assert not (tmp_path / "never.gguf").exists()


def test_merged_export_writes_a_gguf_model_and_names_llama_quantize(
    registry, tiny_adapters, tiny_model_dir, tmp_path
):
    inputs = inputs_of(registry, tiny_adapters["tiny-r8-all"], tiny_model_dir)
    out = tmp_path / "all-q8.gguf"
    result = export_gguf(MERGED_GGUF, inputs, out, "q8_0", lambda f, m: None, threading.Event())
    assert general_type(out) == "model"
    assert result.modelfile.read_text().startswith(f"FROM ./{out.name}")
    message = finished_message(MERGED_GGUF, result, "q8_0")
    assert "q8_0" in message and "llama-quantize" in message and str(result.modelfile) in message


def test_a_dora_adapter_is_refused_by_name(registry, tiny_model_dir, tmp_path):
    adapter = build_adapter(tiny_model_dir, DORA, tmp_path / DORA.name)
    out = tmp_path / "dora.gguf"
    with pytest.raises(AdapterError, match="DoRA"):
        export_gguf(
            ADAPTER_GGUF,
            inputs_of(registry, adapter, tiny_model_dir),
            out,
            "f16",
            lambda f, m: None,
            threading.Event(),
        )
    assert not out.exists() and not out.with_suffix(".Modelfile").exists()
