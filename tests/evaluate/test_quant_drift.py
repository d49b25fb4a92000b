"""How far an adapter's outputs move on a quantized base (``evaluate/quant_drift.py``,
``multilora-studio drift``): the engine's measure against a float64 forward pass of PEFT on the
float base and on the dequantized quantized one, and the command that keeps it in the library,
whose details show it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from multilora_studio.adapters.adapter_tokenizer import load_tokenizer
from multilora_studio.adapters.registry import QUANT_DRIFT, Registry
from multilora_studio.cli import main
from multilora_studio.cli.shared import describe_base
from multilora_studio.engine import EngineConfig
from multilora_studio.evaluate.quant_drift import DRIFT_TEXTS, compare, drift_positions, measure_drift
from multilora_studio.gui.library_details import details_html
from tests.fixtures import AdapterSpec, build_adapter
from tests.quant_fixtures import build_quant_base, build_quantized

ADAPTER = AdapterSpec("drifting", 8, 16, ("q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"), 31)


@pytest.fixture(scope="module")
def bases(tmp_path_factory, tokenizer_dir) -> tuple[Path, Path, Path, Path]:
    """(float base, its AWQ checkpoint, the AWQ weights dequantized as a float folder, an adapter)."""
    base = build_quant_base(tokenizer_dir, tmp_path_factory.mktemp("float"))
    awq, twin = build_quantized(base, "awq", tmp_path_factory.mktemp("awq"))
    return base, awq, twin, build_adapter(base, ADAPTER, tmp_path_factory.mktemp("adapter") / "drifting")


def config(model: Path, **overrides) -> EngineConfig:
    settings = dict(model=str(model), device="cpu", dtype="float32", max_lora_rank=16, max_model_len=128)
    return EngineConfig(**{**settings, **overrides})


def reference_logits(folder: Path, adapter: Path, prompts: list[list[int]]) -> torch.Tensor:
    """[P, V] float64 logits at each prompt's last position: PEFT over the HF model in float64."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float64)
    model = PeftModel.from_pretrained(model, str(adapter)).eval()
    with torch.no_grad():
        return torch.stack([model(torch.tensor([ids])).logits[0, -1] for ids in prompts])


def test_the_drift_equals_peft_in_float64(bases):
    base, awq, twin, adapter = bases
    tokenizer = load_tokenizer(base)
    prompts = drift_positions([tokenizer.encode(text) for text in DRIFT_TEXTS])
    assert len(prompts) == 4 * len(DRIFT_TEXTS) and all(len(p) >= 2 for p in prompts)
    got = measure_drift(config(base), config(awq), tokenizer, adapter)
    expected = compare(reference_logits(base, adapter, prompts), reference_logits(twin, adapter, prompts))
    assert got.positions == expected.positions == len(prompts)
    assert got.mean_kl > 0 and got.mean_kl == pytest.approx(expected.mean_kl, rel=1e-3, abs=1e-6)
    assert got.top1_agreement == expected.top1_agreement
    same = measure_drift(config(base), config(base), tokenizer, adapter)
    assert same.mean_kl == 0.0 and same.top1_agreement == 1.0  # one base against itself


def test_the_drift_command_keeps_it_in_the_library(bases, tmp_path, monkeypatch, capsys):
    base, awq, _, adapter = bases
    monkeypatch.setenv("MULTILORA_STUDIO_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MULTILORA_STUDIO_NO_DEMO_ADAPTERS", "1")
    registry = Registry()
    registry.import_folder(adapter, describe_base(str(base)), name="drifting")
    common = ["--model", str(base), "--device", "cpu", "--dtype", "float32", "--max-lora-rank", "16"]
    assert main(["drift", "drifting", *common, "--quantization", "int4"]) == 0
    assert main(["drift", "drifting", *common, "--quantized-model", str(awq)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith(
        f"drifting: on {base.name} quantized at load to int4 against {base.name}: mean KL "
    )
    assert printed[1].startswith(f"drifting: on {awq.name} (as the checkpoint is quantized)")
    events = [e for e in registry.events("drifting") if e.event == QUANT_DRIFT]
    assert [f"drifting: {e.reason}" for e in events] == printed
    details = details_html(registry.get("drifting"), "disk", None, registry.events("drifting"))
    assert details.count("<b>Quantized base</b>") == 2 and "top-1 agreement" in details
    assert main(["drift", "drifting", *common]) == 1  # no quantized base named: refused, nothing kept
    assert "give --quantization fp8 or int4, or --quantized-model" in capsys.readouterr().err
    assert len([e for e in registry.events("drifting") if e.event == QUANT_DRIFT]) == 2
