"""The quantized layouts against the formats' documented words, what config.json's
``quantization_config`` is read as, and what is refused (by name)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from multilora_studio.engine import Engine, EngineConfig
from multilora_studio.engine.model.model_source import check_model_folder
from multilora_studio.engine.model.quant_pack import pack_awq, pack_gptq_rows, pack_sequential, quantize_gptq
from multilora_studio.engine.model.quantization import (
    Quantization,
    checkpoint_quantization,
    served_quantization,
)
from multilora_studio.engine.step.lora_plan_builder import build_lora_plan
from multilora_studio.kernels.quant_weight import dequantize, unpack_awq, unpack_gptq_rows, unpack_sequential
from tests.quant_fixtures import QUANT_CONFIGS, build_quant_base, build_quantized


def test_awq_packs_eight_columns_in_its_documented_interleaved_order():
    # AutoAWQ (WQLinear_GEMM.from_linear): nibble i of a word holds column [0, 2, 4, 6, 1, 3, 5, 7][i]
    columns = torch.arange(8, dtype=torch.int32).view(1, 8)
    assert pack_awq(columns).item() & 0xFFFFFFFF == 0x75316420
    assert torch.equal(unpack_awq(pack_awq(columns)), columns)


def test_gptq_packs_eight_rows_in_order_along_k():
    # AutoGPTQ (QuantLinear.pack): qweight[r, n] holds rows 8 r .. 8 r + 7, row 8 r + i in nibble i
    rows = torch.arange(16, dtype=torch.int32).remainder(16).view(16, 1).repeat(1, 3)  # [K=16, N=3]
    packed = pack_gptq_rows(rows)
    assert packed.shape == (2, 3)
    assert packed[0, 0].item() & 0xFFFFFFFF == 0x76543210 and packed[1, 2].item() & 0xFFFFFFFF == 0xFEDCBA98
    assert torch.equal(unpack_gptq_rows(packed), rows)
    zeros = torch.tensor([[15, 0, 1, 2, 3, 4, 5, 6]], dtype=torch.int32)
    assert torch.equal(unpack_sequential(pack_sequential(zeros)), zeros)


def test_gptq_zeros_are_stored_minus_one_and_v2_as_they_are():
    w = torch.randn(16, 128) * 0.1
    v1, v2 = quantize_gptq(w, zero_offset=1), quantize_gptq(w, zero_offset=0)
    assert v1.zero_offset == 1 and v2.zero_offset == 0
    assert v1.qzeros is not None and v2.qzeros is not None
    assert torch.all(unpack_sequential(v1.qzeros) + 1 >= 1)
    assert (dequantize(v1, torch.float64) - w.double()).abs().max() < 0.1 * w.abs().max()


@pytest.mark.parametrize(
    ("config", "served"),
    [
        ({}, None),
        (QUANT_CONFIGS["awq"], Quantization("awq", "awq")),
        (QUANT_CONFIGS["gptq"], Quantization("gptq", "gptq", zero_offset=1)),
        (
            {**QUANT_CONFIGS["gptq-act-order"], "checkpoint_format": "gptq_v2"},
            Quantization("gptq", "gptq", act_order=True),
        ),
        (QUANT_CONFIGS["fp8-tensor"], Quantization("fp8", "fp8")),
        (
            {
                "quant_method": "compressed-tensors",
                "format": "float-quantized",
                "config_groups": {
                    "g": {
                        "weights": {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True}
                    }
                },
            },
            Quantization("fp8", "compressed-tensors"),
        ),
    ],
)
def test_quantization_config_is_read(config, served):
    assert checkpoint_quantization({"quantization_config": config} if config else {}) == served


CT_INT4 = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "config_groups": {
        "group_0": {"weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}
    },
}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "quantization method 'bitsandbytes'"),
        ({**QUANT_CONFIGS["awq"], "bits": 3}, "AWQ with 3 bits"),
        ({**QUANT_CONFIGS["awq"], "group_size": 64}, "AWQ with group size 64"),
        ({**QUANT_CONFIGS["awq"], "version": "gemv"}, "AWQ version 'gemv'"),
        ({**QUANT_CONFIGS["awq"], "version": "exllama"}, "AWQ version 'exllama'"),
        ({**QUANT_CONFIGS["awq"], "zero_point": False}, "AWQ without zero points"),
        ({**QUANT_CONFIGS["gptq"], "bits": 8}, "GPTQ with 8 bits"),
        ({**QUANT_CONFIGS["gptq"], "group_size": -1}, "GPTQ with group size -1"),
        ({**QUANT_CONFIGS["gptq"], "checkpoint_format": "marlin"}, "GPTQ checkpoint_format 'marlin'"),
        ({**QUANT_CONFIGS["gptq"], "is_marlin_format": True}, "Marlin's repacked layout"),
        (
            {**QUANT_CONFIGS["fp8-tensor"], "weight_block_size": [128, 128]},
            r"block-wise FP8 \(weight_block_size",
        ),
        ({**QUANT_CONFIGS["fp8-tensor"], "fmt": "e5m2"}, "FP8 format 'e5m2'"),
        (CT_INT4, "pack-quantized, 4-bit int weights, strategy group"),
        ({**CT_INT4, "kv_cache_scheme": {"num_bits": 8}}, "compressed-tensors with kv_cache_scheme"),
    ],
)
def test_unsupported_variants_are_refused_by_name(config, message):
    with pytest.raises(ValueError, match=message):
        checkpoint_quantization({"quantization_config": config})


def test_what_engine_config_quantization_makes_of_a_checkpoint():
    awq = Quantization("awq", "awq")
    assert served_quantization(None, awq, False) is awq
    assert served_quantization("awq", awq, False) is awq
    assert served_quantization("fp8", None, False) == Quantization("fp8", "", at_load=True)
    assert served_quantization("int4", None, False) == Quantization("int4", "", at_load=True)
    assert served_quantization("gptq", None, True) == Quantization("gptq", "", at_load=True, zero_offset=1)
    with pytest.raises(ValueError, match="'fp8' was asked for, but the checkpoint is AWQ 4-bit"):
        served_quantization("fp8", awq, False)
    with pytest.raises(ValueError, match="'int4' was asked for, but the checkpoint is AWQ 4-bit"):
        served_quantization("int4", awq, False)
    with pytest.raises(ValueError, match=r"'gptq' needs a checkpoint quantized so \(GPTQ 4-bit"):
        served_quantization("gptq", None, False)
    refused = "quantization must be one of fp8, int4, awq, gptq or None, got 'int8'"
    with pytest.raises(ValueError, match=refused):
        EngineConfig(quantization="int8")


def test_a_quantized_base_turns_the_shrink_in_gemm_off():
    cpu = torch.device("cpu")
    config = EngineConfig(device="cuda", lora_shrink_in_gemm=None)
    assert build_lora_plan(config, torch.device("cuda"), torch.bfloat16).shrink_in_gemm
    assert not build_lora_plan(config, torch.device("cuda"), torch.bfloat16, quantized=True).shrink_in_gemm
    with pytest.raises(ValueError, match="lora_shrink_in_gemm=True cannot be combined with a quantized base"):
        build_lora_plan(EngineConfig(lora_shrink_in_gemm=True), cpu, torch.float32, quantized=True)


@pytest.fixture(scope="module")
def awq_checkpoint(tmp_path_factory, tokenizer_dir):
    base = build_quant_base(tokenizer_dir, tmp_path_factory.mktemp("float"))
    return build_quantized(base, "awq", tmp_path_factory.mktemp("awq"))[0]


def test_engine_start_refuses_an_unsupported_checkpoint_and_a_mismatch(awq_checkpoint, tmp_path):
    bad = tmp_path / "awq-gemv"
    shutil.copytree(awq_checkpoint, bad)
    config = json.loads((bad / "config.json").read_text())
    config["quantization_config"]["version"] = "gemv_fast"
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="AWQ version 'gemv_fast'"):
        check_model_folder(bad)
    with pytest.raises(ValueError, match="AWQ version 'gemv_fast'"):
        Engine(EngineConfig(model=str(bad), device="cpu", dtype="float32", max_model_len=64))
    with pytest.raises(ValueError, match="'gptq' was asked for, but the checkpoint is AWQ 4-bit"):
        Engine(EngineConfig(model=str(awq_checkpoint), device="cpu", quantization="gptq", max_model_len=64))
    with pytest.raises(ValueError, match="lora_shrink_in_gemm=True cannot be combined"):
        Engine(
            EngineConfig(model=str(awq_checkpoint), device="cpu", lora_shrink_in_gemm=True, max_model_len=64)
        )


def test_a_quantized_tensor_is_never_read_as_float(awq_checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "no-config"
    shutil.copytree(awq_checkpoint, bad)
    config = json.loads((bad / "config.json").read_text())
    del config["quantization_config"]
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"stored quantized, but config\.json has no quantization_config"):
        Engine(EngineConfig(model=str(bad), device="cpu", dtype="float32", max_model_len=64))
    head = tmp_path / "fp8-embeddings"
    shutil.copytree(awq_checkpoint, head)
    tensors = load_file(str(head / "model.safetensors"))
    tensors["model.embed_tokens.weight"] = tensors["model.embed_tokens.weight"].to(torch.float8_e4m3fn)
    save_file(tensors, str(head / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"embed_tokens\.weight is stored quantized"):
        Engine(EngineConfig(model=str(head), device="cpu", dtype="float32", max_model_len=64))


def test_the_quant_plan_follows_the_device_gemlite_and_batch_invariance(caplog):
    """CPU: dequantized at load; CUDA: gemlite's kernels where installed, cuBLAS without it (a
    warning naming the extra) and always in batch-invariant mode (gemlite's atomics)."""
    import importlib.util

    from multilora_studio.engine.step.quant_plan_builder import build_quant_plan
    from multilora_studio.kernels.quant_linear import QuantPlan

    assert build_quant_plan(torch.device("cpu"), torch.float32) == QuantPlan(dequantize_at_load=True)
    cublas = QuantPlan(dequantize_at_load=False, fp8="cublas", int4="cublas")
    assert build_quant_plan(torch.device("cuda"), torch.bfloat16, batch_invariant=True) == cublas
    with caplog.at_level("WARNING"):
        plan = build_quant_plan(torch.device("cuda"), torch.bfloat16)
    if importlib.util.find_spec("gemlite") is None:
        assert plan == cublas
        assert 'need gemlite (the package\'s extra cuda): pip install -e ".[cuda]"' in caplog.text
    else:
        assert plan == QuantPlan(dequantize_at_load=False, fp8="gemlite", int4="gemlite")
