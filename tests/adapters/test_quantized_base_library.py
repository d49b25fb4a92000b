"""An adapter validated against a float base is served on its quantized versions (an AWQ
checkpoint, the float weights quantized to FP8 at load), and the library says so: the log
and the audit log name the base it was trained on and the one that serves it."""

from __future__ import annotations

import logging
import shutil

import pytest

from multilora_studio.adapters.base_quantization import BaseQuantization, base_quantization_of
from multilora_studio.adapters.registry import SERVED_QUANTIZED, BaseMismatchError, Registry, serve_record
from multilora_studio.cli.serve import pool_base_quantization
from multilora_studio.cli.shared import describe_base
from multilora_studio.engine import Engine, EngineConfig, SamplingParams
from tests.fixtures import AdapterSpec, build_adapter
from tests.quant_fixtures import build_quant_base, build_quantized


@pytest.fixture(scope="module")
def float_base(tmp_path_factory, tokenizer_dir):
    return build_quant_base(tokenizer_dir, tmp_path_factory.mktemp("float-base"))


@pytest.fixture(scope="module")
def awq_base(tmp_path_factory, float_base):
    return build_quantized(float_base, "awq", tmp_path_factory.mktemp("awq"))[0]


@pytest.fixture(scope="module")
def adapter(tmp_path_factory, float_base):
    spec = AdapterSpec("qv", 8, 16, ("q_proj", "v_proj", "down_proj"), 31)
    return build_adapter(float_base, spec, tmp_path_factory.mktemp("adapter") / "qv")


def config(model, **overrides) -> EngineConfig:
    return EngineConfig(
        model=str(model), device="cpu", dtype="float32", max_loras=2, max_model_len=64, **overrides
    )


def test_the_quantization_of_a_served_base(float_base, awq_base):
    assert base_quantization_of(float_base, None) is None
    assert base_quantization_of(awq_base, None) == BaseQuantization("awq")
    assert base_quantization_of(float_base, "fp8") == BaseQuantization("fp8", at_load=True)
    assert base_quantization_of(None, None) is None
    assert pool_base_quantization(config(awq_base)) == BaseQuantization("awq")
    assert pool_base_quantization(
        EngineConfig(model="random:llama3-8b", quantization="gptq")
    ) == BaseQuantization("gptq", at_load=True)


def test_status_of_an_adapter_on_quantized_versions_of_its_base(tmp_path, float_base, awq_base, adapter):
    registry = Registry(tmp_path / "library")
    record = registry.import_folder(adapter, describe_base(str(float_base)), name="qv")
    float_digest = record.base_digest
    awq_digest = describe_base(str(awq_base)).digest
    assert awq_digest != float_digest  # the quantized checkpoint's files
    assert record.base_status(float_digest) == "ok"
    assert record.base_status(awq_digest) == "mismatch"
    assert record.base_status(awq_digest, BaseQuantization("awq")) == "quantized"
    assert record.base_status(float_digest, BaseQuantization("fp8", at_load=True)) == "quantized"
    # validated on the quantized checkpoint itself: that base, as it is
    assert record.base_status(float_digest, BaseQuantization("awq")) == "ok"


@pytest.mark.parametrize("quantized", ["awq-checkpoint", "fp8-at-load"])
def test_a_quantized_base_serves_the_float_bases_adapter_and_the_library_says_so(
    tmp_path, float_base, awq_base, adapter, caplog, quantized
):
    registry = Registry(tmp_path / "library")
    registry.import_folder(adapter, describe_base(str(float_base)), name="qv")
    engine_config = (
        config(awq_base) if quantized == "awq-checkpoint" else config(float_base, quantization="fp8")
    )
    with Engine(engine_config) as engine, caplog.at_level(logging.INFO):
        registry.load_into(engine, "qv")
        engine.remove_adapter("qv")
        registry.load_into(engine, "qv")  # again on the same base: noted once
        out = engine.generate(["Hello"], ["qv"], SamplingParams(max_tokens=3, temperature=0))[0]
        assert len(out.token_ids) == 3
        served_name, served_digest = engine.model_name, engine.base_digest
    notes = [e for e in registry.events("qv") if e.event == SERVED_QUANTIZED]
    assert len(notes) == 1
    label = "awq" if quantized == "awq-checkpoint" else "fp8, quantized at load"
    expected = f"is served on {served_name} ({label}, sha256 {served_digest[:12]})"
    reason = notes[0].reason
    assert reason.startswith(f"adapter 'qv' was trained on base {float_base.name} (sha256 ")
    assert reason.endswith(expected)
    assert caplog.messages.count(reason) == 2  # the log says it at each load, word for word


def test_a_float_base_of_other_weights_is_still_a_mismatch(tmp_path, float_base, adapter):
    other = shutil.copytree(float_base, tmp_path / "other")
    registry = Registry(tmp_path / "library")
    registry.import_folder(adapter, describe_base(str(float_base)), name="qv")
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(other / "model.safetensors"))
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * 1.01
    save_file(tensors, str(other / "model.safetensors"), metadata={"format": "pt"})
    with Engine(config(other)) as engine:
        with pytest.raises(BaseMismatchError):
            registry.load_into(engine, "qv")
        with pytest.raises(BaseMismatchError):  # the window's path: no override unless asked for
            serve_record(engine, registry.get("qv"), preload=False)
        assert engine.list_adapters() == []


def test_an_adapter_validated_on_the_quantized_checkpoint_itself_gets_no_quantized_note(
    tmp_path, awq_base, adapter, caplog
):
    """Served on the base it was validated against (an AWQ checkpoint, as it is), an adapter is
    on its own base: nothing to say in its log."""
    registry = Registry(tmp_path / "library")
    registry.import_folder(adapter, describe_base(str(awq_base)), name="qv")
    with Engine(config(awq_base)) as engine, caplog.at_level(logging.INFO):
        registry.load_into(engine, "qv")
        assert [a.name for a in engine.list_adapters()] == ["qv"]
    assert [e for e in registry.events("qv") if e.event == SERVED_QUANTIZED] == []
    assert not any("was trained on base" in message for message in caplog.messages)


def test_the_audit_log_notes_each_quantized_base_once(tmp_path, float_base, adapter):
    registry = Registry(tmp_path / "library")
    record = registry.import_folder(adapter, describe_base(str(float_base)), name="qv")
    awq, fp8 = BaseQuantization("awq"), BaseQuantization("fp8", at_load=True)
    first = registry.note_serving(record, "base-awq", "1" * 64, awq)
    assert first.startswith(f"adapter 'qv' was trained on base {float_base.name} (sha256 ")
    assert first.endswith("served on base-awq (awq, sha256 111111111111)")
    assert registry.note_serving(record, "base-awq", "1" * 64, awq) == first  # noted once
    second = registry.note_serving(record, "base-fp8", "2" * 64, fp8)
    notes = [e.reason for e in registry.events("qv") if e.event == SERVED_QUANTIZED]
    assert sorted(notes) == sorted([first, second])
