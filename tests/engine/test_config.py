"""EngineConfig and SamplingParams: defaults, normalisation, and a clear ValueError for every bad value."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from multilora_studio.engine.config import EngineConfig
from multilora_studio.engine.residency.host_tier_size import (
    MAX_AUTO_HOST_ADAPTERS,
    host_tier_capacity,
    least_host_capacity,
)
from multilora_studio.engine.sampling_params import SamplingParams


def test_engine_defaults_are_valid_and_follow_vllm_names():
    config = EngineConfig()
    assert config.model is None and config.device == "auto" and config.dtype == "auto"
    assert config.max_loras == 8 and config.max_cpu_loras is None  # sized from host memory
    assert config.max_num_batched_tokens >= config.max_num_seqs


@pytest.mark.parametrize(
    "settings",
    [
        dict(device="cpu", dtype="float32"),
        dict(device="cuda:1", dtype="bfloat16"),
        dict(device="cuda", dtype="float16"),
        dict(max_loras=1, max_cpu_loras=1),
        dict(max_loras=4, max_cpu_loras=4),
        dict(max_num_seqs=4, max_num_batched_tokens=4),
        dict(block_size=1, max_model_len=16),
        dict(block_size=256),
        dict(kv_cache_memory_gb=0.25),
        dict(kv_cache_memory_gb=2),
        dict(enforce_eager=True, seed=123),
        dict(model="random:tiny"),
    ],
)
def test_valid_engine_settings_are_accepted(settings):
    config = EngineConfig(**settings)
    for key, value in settings.items():
        assert getattr(config, key) == value


def test_the_host_tier_is_sized_from_host_memory_unless_set():
    gib = 1 << 30
    auto = EngineConfig(max_loras=3)  # a quarter of 64 GiB in 84 MB adapters (an 8B model's rank 16)
    assert host_tier_capacity(auto, 84 * 10**6, 64 * gib) == (64 * gib // 4) // (84 * 10**6) == 204
    assert host_tier_capacity(auto, 84 * 10**6, 1 * gib) == 6  # never below twice the GPU slots
    assert host_tier_capacity(auto, 1000, 64 * gib) == MAX_AUTO_HOST_ADAPTERS
    half = EngineConfig(max_loras=3, cpu_lora_memory_fraction=0.5)
    assert host_tier_capacity(half, 84 * 10**6, 64 * gib) == (64 * gib // 2) // (84 * 10**6)
    assert host_tier_capacity(EngineConfig(max_loras=3, max_cpu_loras=5), 84 * 10**6, 64 * gib) == 5
    assert least_host_capacity(auto) == 6 and least_host_capacity(EngineConfig(max_cpu_loras=9)) == 9
    for fraction in (0, -0.1, 0.95, float("nan")):
        with pytest.raises(ValueError, match="cpu_lora_memory_fraction"):
            EngineConfig(cpu_lora_memory_fraction=fraction)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(model=""), "model must be a folder path"),
        (dict(model="   "), "model must be a folder path"),
        (dict(model=3), "model must be a folder path"),
        (dict(device="gpu"), "device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got 'gpu'"),
        (dict(device="cuda:"), "device must be"),
        (dict(device="cuda:x"), "device must be"),
        (dict(device="cuda:0 "), "device must be"),
        (dict(device=0), "device must be"),
        (dict(dtype="fp16"), "dtype must be one of float32, bfloat16, float16, auto, got 'fp16'"),
        (dict(dtype=None), "dtype must be one of"),
        (dict(dtype=["float32"]), "dtype must be one of"),
        (dict(max_loras=0), "max_loras must be between 1 and 1024, got 0"),
        (dict(max_loras=2000), "max_loras must be between 1 and 1024"),
        (dict(max_loras=2.0), "max_loras must be an integer, got 2.0"),
        (dict(max_loras=True), "max_loras must be an integer"),
        (dict(max_loras="8"), "max_loras must be an integer"),
        (dict(max_lora_rank=0), "max_lora_rank must be between 1 and 512"),
        (dict(max_lora_rank=1024), "max_lora_rank must be between 1 and 512"),
        (dict(max_cpu_loras=0), "max_cpu_loras must be >= 1"),
        (dict(max_cpu_loras=2, max_loras=4), r"max_cpu_loras \(2\) must be >= max_loras \(4\)"),
        (dict(max_cpu_loras=1.5), "max_cpu_loras must be an integer"),
        (dict(max_num_seqs=0), "max_num_seqs must be between 1 and 4096"),
        (dict(max_model_len=8), "max_model_len must be between 16 and"),
        (dict(max_model_len=None), "max_model_len must be an integer"),
        (dict(max_num_batched_tokens=0), "max_num_batched_tokens must be between 1 and"),
        (dict(max_num_batched_tokens=8, max_num_seqs=16), "max_num_batched_tokens must be >= max_num_seqs"),
        (dict(block_size=0), "block_size must be between 1 and 256"),
        (dict(block_size=512), "block_size must be between 1 and 256"),
        (dict(block_size=24), "block_size must be a power of two, got 24"),
        (dict(kv_cache_memory_gb=0), r"kv_cache_memory_gb must be in \(0, 4096\], got 0"),
        (dict(kv_cache_memory_gb=-1.5), "kv_cache_memory_gb must be in"),
        (dict(kv_cache_memory_gb=5000), "kv_cache_memory_gb must be in"),
        (dict(kv_cache_memory_gb=math.nan), "kv_cache_memory_gb must be a number"),
        (dict(kv_cache_memory_gb=math.inf), "kv_cache_memory_gb must be in"),
        (dict(kv_cache_memory_gb="2"), "kv_cache_memory_gb must be a number, got '2'"),
        (dict(kv_cache_memory_gb=[2]), "kv_cache_memory_gb must be a number"),
        (dict(kv_cache_memory_gb=True), "kv_cache_memory_gb must be a number"),
        (dict(enforce_eager="no"), "enforce_eager must be True or False, got 'no'"),
        (dict(enforce_eager=1), "enforce_eager must be True or False"),
        (dict(seed=-1), "seed must be >= 0, got -1"),
        (dict(seed=1.0), "seed must be an integer"),
        (dict(adapter_loader="fork"), "adapter_loader must be one of auto, thread, process, got 'fork'"),
        (dict(adapter_load_workers=0), "adapter_load_workers must be between 1 and 64, got 0"),
        (dict(adapter_load_workers=2.5), "adapter_load_workers must be an integer"),
        (dict(lora_shrink_in_gemm="yes"), "lora_shrink_in_gemm must be True, False or None, got 'yes'"),
        (dict(lora_shrink_in_gemm=1), "lora_shrink_in_gemm must be True, False or None"),
        (dict(fused_qkv_epilogue="yes"), "fused_qkv_epilogue must be True, False or None, got 'yes'"),
        (dict(fused_qkv_epilogue=0), "fused_qkv_epilogue must be True, False or None"),
        (dict(cpu_weight_packing=None), "cpu_weight_packing must be True or False, got None"),
    ],
)
def test_bad_engine_settings_raise_value_error_naming_the_setting(settings, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**settings)


def test_adapter_load_workers_by_device_and_loader():
    assert EngineConfig().load_workers_for("cpu") == 1
    for cores, loads in ((16, 8), (64, 8), (8, 4), (2, 1), (1, 1)):  # half the cores, 1 to 8
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(os, "cpu_count", lambda cores=cores: cores)
            assert EngineConfig().load_workers_for("cuda") == loads
    assert EngineConfig(adapter_load_workers=6).load_workers_for("cpu") == 6
    assert EngineConfig(adapter_load_workers=6, adapter_loader="process").load_workers_for("cuda") == 6


def test_auto_adapter_loader_is_a_process_on_cuda_and_a_thread_on_the_cpu():
    assert EngineConfig().loader_for("cuda") == "process"
    assert EngineConfig().loader_for("cpu") == "thread"
    assert EngineConfig(adapter_loader="thread").loader_for("cuda") == "thread"
    assert EngineConfig(adapter_loader="process").loader_for("cpu") == "process"


def test_sampling_defaults():
    params = SamplingParams()
    assert params.max_tokens == 128 and params.temperature == 1.0 and params.top_p == 1.0
    assert params.stop == () and params.stop_token_ids == () and not params.greedy


def test_sampling_normalises_stop_lists():
    assert SamplingParams(stop="###").stop == ("###",)
    assert SamplingParams(stop=["a", "bc"]).stop == ("a", "bc")
    assert SamplingParams(stop=None).stop == ()
    assert SamplingParams(stop_token_ids=[2, 5]).stop_token_ids == (2, 5)
    assert SamplingParams(stop_token_ids=None).stop_token_ids == ()
    assert sorted(SamplingParams(stop={"x", "y"}).stop) == ["x", "y"]


@pytest.mark.parametrize(
    "settings",
    [
        dict(temperature=0),
        dict(temperature=0.0, top_p=0.01, top_k=1),
        dict(temperature=100),
        dict(top_p=1),
        dict(seed=0, max_tokens=1),
        dict(ignore_eos=True),
    ],
)
def test_valid_sampling_settings_are_accepted(settings):
    params = SamplingParams(**settings)
    for key, value in settings.items():
        assert getattr(params, key) == value
    assert params.greedy == (params.temperature == 0)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(max_tokens=-1), "max_tokens must be >= 0, got -1"),
        (dict(max_tokens=None), "max_tokens must be an integer, got None"),
        (dict(max_tokens=2.5), "max_tokens must be an integer"),
        (dict(temperature=-0.1), r"temperature must be in \[0, 100\], got -0.1"),
        (dict(temperature=101), "temperature must be in"),
        (dict(temperature=math.nan), "temperature must be a number"),
        (dict(temperature="hot"), "temperature must be a number, got 'hot'"),
        (dict(temperature=None), "temperature must be a number"),
        (dict(temperature=True), "temperature must be a number"),
        (dict(top_p=0), r"top_p must be in \(0, 1\], got 0"),
        (dict(top_p=1.01), "top_p must be in"),
        (dict(top_p=math.nan), "top_p must be a number"),
        (dict(top_p="1"), "top_p must be a number"),
        (dict(top_k=-1), "top_k must be >= 0, got -1"),
        (dict(top_k=1.0), "top_k must be an integer"),
        (dict(seed=-5), "seed must be between 0 and 9223372036854775807"),
        (dict(seed="7"), "seed must be an integer"),
        (dict(stop=[""]), "stop must be a list of non-empty strings"),
        (dict(stop=["ok", 3]), "stop must be a list of non-empty strings"),
        (dict(stop=""), "stop must be a list of non-empty strings"),
        (dict(stop=5), "stop must be a list of non-empty strings, got 5"),
        (dict(stop=b"x"), "stop must be a list of non-empty strings"),
        (dict(stop_token_ids=[1, -2]), "stop_token_ids entry must be >= 0, got -2"),
        (dict(stop_token_ids=["2"]), "stop_token_ids entry must be an integer"),
        (dict(stop_token_ids=2), "stop_token_ids must be a list of token ids, got 2"),
        (dict(stop_token_ids="12"), "stop_token_ids must be a list of token ids"),
        (dict(ignore_eos="yes"), "ignore_eos must be True or False, got 'yes'"),
    ],
)
def test_bad_sampling_settings_raise_value_error_naming_the_setting(settings, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**settings)


def test_model_may_be_a_string_or_a_path():
    assert EngineConfig(model="~/models/llama").model == "~/models/llama"
    assert EngineConfig(model=Path("relative/dir")).model == "relative/dir"
