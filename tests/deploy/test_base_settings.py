"""A base's own engine settings: the ``MODEL[,SETTING=VALUE...]`` form ``serve --model`` and the
window's models list read, applied over the shared settings, and refused with a message that
names what is wrong."""

from __future__ import annotations

import re

import pytest

from multilora_studio.cli import build_parser
from multilora_studio.cli.shared import engine_configs
from multilora_studio.deploy.base_settings import BaseSettings, check_kv_sizes, format_model, parse_model
from multilora_studio.engine import EngineConfig


def test_the_form_reads_and_writes_each_setting():
    model, own = parse_model("/models/qwen,max-loras=4,max-lora-rank=64,max-cpu-loras=32,kv-cache-gb=2.5")
    assert model == "/models/qwen"
    assert own == BaseSettings(max_loras=4, max_lora_rank=64, max_cpu_loras=32, kv_cache_memory_gb=2.5)
    assert (
        format_model(model, own)
        == "/models/qwen,max-loras=4,max-lora-rank=64,max-cpu-loras=32,kv-cache-gb=2.5"
    )
    assert parse_model(" /models/qwen , kv-cache-gb = 1 ") == (
        "/models/qwen",
        BaseSettings(kv_cache_memory_gb=1.0),
    )
    assert parse_model("/models/a,b") == ("/models/a,b", BaseSettings())  # no SETTING=VALUE: a name
    assert format_model("/models/qwen", BaseSettings()) == "/models/qwen"


def test_a_folder_with_a_comma_and_an_equals_sign_is_taken_whole(tmp_path):
    folder = tmp_path / "run,max-loras=4"
    folder.mkdir()
    assert parse_model(str(folder)) == (str(folder), BaseSettings())
    assert parse_model(f"{folder},max-loras=2") == (str(folder), BaseSettings(max_loras=2))


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            "/m,max_num_seqs=4",
            "'max_num_seqs' is not a setting a base model may set for itself; one of max-loras",
        ),
        ("/m,max-loras=2,max-loras=3", "max-loras is given twice"),
        ("/m,max-loras=two", "max-loras takes a whole number, got 'two'"),
        ("/m,max-loras=2.5", "max-loras takes a whole number, got '2.5'"),
        ("/m,kv-cache-gb=lots", "kv-cache-gb takes a number of GB, got 'lots'"),
        (",max-loras=2", "name the model before its settings"),
    ],
)
def test_what_the_form_refuses(text, says):
    with pytest.raises(ValueError, match="^" + re.escape(text)) as error:
        parse_model(text)
    assert says in str(error.value)


def test_own_settings_replace_only_theirs_and_engineconfig_checks_them():
    shared = EngineConfig(max_loras=8, max_lora_rank=16, kv_cache_memory_gb=1.0, max_model_len=64)
    own = BaseSettings(max_loras=2, kv_cache_memory_gb=0.5).apply(shared)
    assert (own.max_loras, own.max_lora_rank, own.kv_cache_memory_gb, own.max_model_len) == (2, 16, 0.5, 64)
    assert BaseSettings().apply(shared) is shared
    with pytest.raises(ValueError, match="max_cpu_loras"):
        BaseSettings(max_cpu_loras=4).apply(shared)  # fewer than its 8 slots


def test_several_bases_on_a_gpu_need_each_kv_size():
    sized, unsized = EngineConfig(kv_cache_memory_gb=1.0), EngineConfig()
    check_kv_sizes([sized, sized], on_gpu=True)
    check_kv_sizes([unsized, unsized], on_gpu=False)
    check_kv_sizes([unsized], on_gpu=True)
    with pytest.raises(ValueError, match=r"^kv_cache_memory_gb: give each base model's KV cache size"):
        check_kv_sizes([sized, unsized], on_gpu=True)


def test_serve_takes_each_models_own_settings_over_the_flags():
    args = build_parser().parse_args(
        [
            "serve",
            "--max-loras",
            "6",
            "--kv-cache-gb",
            "1",
            "--model",
            "/m/a",
            "--model",
            "/m/b,max-loras=2,kv-cache-gb=0.5",
        ]
    )
    first, second = engine_configs(args)
    assert (first.model, first.max_loras, first.kv_cache_memory_gb) == ("/m/a", 6, 1.0)
    assert (second.model, second.max_loras, second.kv_cache_memory_gb) == ("/m/b", 2, 0.5)
    assert second.max_lora_rank == first.max_lora_rank == EngineConfig().max_lora_rank  # one default
