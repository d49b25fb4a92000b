"""Settings shows a base's quantization, the memory it saves and what each format costs and buys,
and applies ``quantization``."""

from __future__ import annotations

from pathlib import Path

import pytest

from multilora_studio.engine.model.format_costs import base_format_costs, format_costs, kv_bytes_per_token
from multilora_studio.engine.model.model_spec import load_spec
from multilora_studio.engine.model.quantization import Quantization, projection_bytes, quantization_summary
from tests.gui.conftest import save_screenshot, wait_ready
from tests.quant_fixtures import build_quant_base, build_quantized


@pytest.fixture(scope="module")
def awq_base(tmp_path_factory, tokenizer_dir) -> Path:
    base = build_quant_base(tokenizer_dir, tmp_path_factory.mktemp("float"))
    return build_quantized(base, "awq", tmp_path_factory.mktemp("awq"))[0]


def test_projection_bytes_of_each_format(awq_base):
    spec = load_spec(awq_base)
    dense, fp8 = projection_bytes(spec, Quantization("fp8"))
    weights = dense // 2
    rows = sum(
        spec.projection_shape(m)[0]
        for m in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    )
    assert fp8 == weights + 4 * spec.num_layers * rows  # a float32 scale per output row
    _, int4 = projection_bytes(spec, Quantization("awq"))
    assert int4 == weights // 2 + weights * 5 // 256  # a 16-bit scale and a 4-bit zero per 128
    assert projection_bytes(spec, None) == (dense, dense)
    assert quantization_summary(awq_base, None) == ("AWQ 4-bit", (dense, int4))
    refused, sizes = quantization_summary(awq_base, "fp8")
    assert "'fp8' was asked for, but the checkpoint is AWQ 4-bit" in refused and sizes is None
    assert quantization_summary(awq_base.parent / "missing", None) == ("", None)
    assert quantization_summary(None, "fp8") == ("FP8 (e4m3), quantized at load", None)


def test_each_format_costs_its_bytes_and_leaves_the_rest_to_the_kv_cache(awq_base, tiny_model_dir):
    spec = load_spec(tiny_model_dir)
    costs = format_costs(spec, None, memory=10**9)
    assert [c.label for c in costs] == [
        "bf16",
        "FP8 (e4m3), quantized at load",
        "4-bit (groups of 128), quantized at load",
    ]
    head = spec.vocab_size * spec.hidden_size * 2
    tables = head if spec.tie_word_embeddings else 2 * head
    for cost in costs:
        _, projections = projection_bytes(spec, cost.quantization)
        assert cost.read_per_token == projections + head  # every projection and the LM head, once
        assert tables + projections < cost.weight_bytes < tables + projections + 2**20  # and the norms
        kv = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * 2  # K and V, bf16
        assert kv == kv_bytes_per_token(spec) and cost.kv_tokens == (10**9 - cost.weight_bytes) // kv
    bf16, fp8, int4 = costs
    assert bf16.read_per_token > fp8.read_per_token > int4.read_per_token
    assert bf16.kv_tokens < fp8.kv_tokens < int4.kv_tokens  # what fewer bytes buy
    assert all(c.kv_tokens is None for c in format_costs(spec, None, memory=None))
    awq = base_format_costs(awq_base, memory=None)
    assert [c.label for c in awq] == ["AWQ 4-bit"]  # a quantized checkpoint is served as it is
    assert base_format_costs(awq_base.parent / "missing", None) == []


def test_settings_show_the_quantization_and_apply_it(qtbot, open_window, awq_base, tiny_model_dir):
    window = open_window()
    settings = window.settings
    window.show_page("Settings")
    assert settings.quantization.currentData() == "" and settings.quantization_info.text().startswith("Float")
    assert "<td><b>bf16</b></td>" in settings.format_costs.text()  # the float folder, as it is
    settings.model.setText(str(awq_base))
    assert settings.quantization_info.text().startswith("AWQ 4-bit: projections ")
    assert "<b>AWQ 4-bit</b>" in settings.format_costs.text()
    assert "KiB in bf16 (saves " in settings.quantization_info.text()
    settings.quantization.setCurrentIndex(settings.quantization.findData("fp8"))
    assert settings.quantization_info.text().startswith("Not served: quantization 'fp8' was asked for")
    settings.model.setText(str(tiny_model_dir))
    assert settings.quantization_info.text().startswith("FP8 (e4m3), quantized at load")
    table = settings.format_costs.text()
    assert "<td>bf16</td>" in table and "<b>FP8 (e4m3), quantized at load</b>" in table
    assert "4-bit (groups of 128), quantized at load" in table
    settings.embedded.setChecked(True)
    assert settings.format_costs.text() == ""  # no config.json to read
    settings.folder.setChecked(True)
    assert settings.choice().quantization == "fp8"
    assert settings.apply()
    wait_ready(qtbot, window)
    engine = window.host.engine
    assert engine.config.quantization == "fp8"
    quantization = engine.runner.weights.quantization
    assert quantization is not None and quantization.at_load
    assert settings.quantization_info.text().startswith("FP8 (e4m3), quantized at load: projections")
    save_screenshot(window, "settings-quantization")
    again = open_window()
    assert again.settings.quantization.currentData() == "fp8"
