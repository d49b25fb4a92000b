"""``multilora-studio compare`` runs one batched request set and prints what the engine produced."""

from __future__ import annotations

import json

from multilora_studio.adapters.registry import Registry
from multilora_studio.cli import main
from multilora_studio.cli.shared import describe_base
from multilora_studio.engine import Engine, EngineConfig, SamplingParams


def compare_json(capsys, *args: str) -> list[dict]:
    assert main(["compare", "--json", "--raw", "--device", "cpu", "--max-tokens", "10", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_compare_outputs_equal_direct_engine_outputs(
    capsys, tiny_model_dir, tiny_adapters, monkeypatch, tmp_path
):
    monkeypatch.setenv("MULTILORA_STUDIO_HOME", str(tmp_path))
    Registry().import_folder(
        tiny_adapters["tiny-r16-mlp"], describe_base(str(tiny_model_dir)), name="from-library"
    )
    records = compare_json(
        capsys,
        "--prompt",
        "Once upon a time",
        "--model",
        str(tiny_model_dir),
        "--max-lora-rank",
        "32",
        "--adapters",
        "tiny-r4-qv,base,from-library",
        "--lora-modules",
        f"tiny-r4-qv={tiny_adapters['tiny-r4-qv']}",
    )
    assert [r["adapter"] for r in records] == ["tiny-r4-qv", "base", "from-library"]
    config = EngineConfig(model=str(tiny_model_dir), device="cpu", max_lora_rank=32)
    with Engine(config) as engine:
        engine.add_adapter("a", tiny_adapters["tiny-r4-qv"])
        engine.add_adapter("b", tiny_adapters["tiny-r16-mlp"])
        expected = engine.generate(
            ["Once upon a time"] * 3, ["a", None, "b"], SamplingParams(max_tokens=10, temperature=0)
        )
    assert [r["text"] for r in records] == [o.text for o in expected]
    assert len({r["text"] for r in records}) == 3


def test_compare_refuses_unknown_adapters_clearly(capsys, tiny_model_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("MULTILORA_STUDIO_HOME", str(tmp_path))
    code = main(["compare", "--prompt", "Hi", "--model", str(tiny_model_dir), "--adapters", "nope,base"])
    assert code == 1
    assert "unknown adapters nope" in capsys.readouterr().err


def test_every_subcommand_has_help(capsys):
    for command in (
        ["--help"],
        ["compare", "--help"],
        ["model", "--help"],
        ["adapters", "--help"],
        ["pull", "--help"],
    ):
        try:
            main(command)
        except SystemExit as done:
            assert done.code == 0
        assert "usage: multilora-studio" in capsys.readouterr().out
