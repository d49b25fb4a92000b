"""Many adapters from few weight files: linked on disk, separate adapters to the engine."""

from __future__ import annotations

import pytest

from multilora_studio.bench.adapter_pool import make_adapter_pool, parse_targets
from multilora_studio.engine import Engine, EngineConfig, SamplingParams
from multilora_studio.engine.model.model_spec import PROJECTIONS, load_spec


def test_linked_adapters_share_bytes_but_load_separately(tiny_model_dir, tmp_path):
    spec = load_spec(tiny_model_dir)
    pool = make_adapter_pool(
        spec, tmp_path / "pool", count=5, distinct=2, rank=4, targets=("q_proj", "v_proj")
    )
    assert list(pool) == [f"bench-{i}" for i in range(5)]
    weights = {name: folder / "adapter_model.safetensors" for name, folder in pool.items()}
    inode = {name: path.stat().st_ino for name, path in weights.items()}
    assert inode["bench-0"] == inode["bench-2"] == inode["bench-4"] != inode["bench-1"] == inode["bench-3"]
    assert weights["bench-0"].stat().st_nlink == 3
    assert all((folder / "adapter_config.json").is_file() for folder in pool.values())

    config = EngineConfig(
        model=str(tiny_model_dir), device="cpu", max_loras=2, max_cpu_loras=8, max_model_len=256
    )
    with Engine(config) as engine:
        for name, folder in pool.items():
            engine.add_adapter(name, folder, preload=False)
        params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
        names = list(pool)
        outputs = engine.generate([[5, 6, 7, 8]] * 6, [*names, None], params)
        metrics = engine.metrics(fresh=True)
    tokens = {o.adapter: o.token_ids for o in outputs}
    assert tokens["bench-0"] == tokens["bench-2"] == tokens["bench-4"]
    assert tokens["bench-1"] == tokens["bench-3"] != tokens["bench-0"]
    assert tokens[None] not in (tokens["bench-0"], tokens["bench-1"])
    assert metrics.cpu_misses == 5  # every adapter read from disk on its own
    assert metrics.gpu_misses >= 5  # and uploaded into a slot on its own


def test_targets_option():
    assert parse_targets("all") == PROJECTIONS
    assert parse_targets("q_proj, v_proj,q_proj") == ("q_proj", "v_proj")
    with pytest.raises(ValueError, match="--targets"):
        parse_targets("qkv")
