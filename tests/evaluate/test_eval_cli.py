"""``multilora-studio eval`` end to end on a small prompt file, the tiny model and a real library."""

from __future__ import annotations

import json

from multilora_studio.adapters.registry import Registry
from multilora_studio.cli import main
from multilora_studio.cli.shared import describe_base
from multilora_studio.engine import Engine, EngineConfig
from multilora_studio.evaluate import (
    EvalSettings,
    load_prompt_set,
    read_cells_csv,
    read_results_json,
    run_eval,
)
from multilora_studio.evaluate.export import score_lines
from tests.evaluate.conftest import write_jsonl

ROWS = [
    {"prompt": "Once upon a time", "reference": " there"},
    {
        "prompt": "The sky is",
        "reference": " blue",
        "check": {"type": "choice", "choices": [" blue", " green"]},
    },
    {"prompt": "Say something:", "check": {"type": "regex", "pattern": "[a-z]"}},
]


def test_eval_prints_the_scores_saves_exports_and_records_them(
    capsys, tiny_model_dir, tiny_adapters, monkeypatch, tmp_path
):
    monkeypatch.setenv("MULTILORA_STUDIO_HOME", str(tmp_path / "home"))
    Registry().import_folder(tiny_adapters["tiny-r16-mlp"], describe_base(str(tiny_model_dir)), name="mlp")
    prompts = write_jsonl(tmp_path / "mine.jsonl", ROWS)
    code = main(
        [
            "eval", "--prompts", str(prompts), "--adapters", "side,base,mlp", "--check", "contains",
            "--model", str(tiny_model_dir), "--device", "cpu", "--max-lora-rank", "32", "--max-tokens", "6",
            "--lora-modules", f"side={tiny_adapters['tiny-r4-qv']}", "--out", str(tmp_path / "out"),
            "--format", "csv",
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    (saved,) = (tmp_path / "out").glob("mine-*.json")
    results = read_results_json(saved)
    assert results.adapters == ["side", "base", "mlp"]
    for line in score_lines(results):
        assert line in out
    assert f"results: {saved}" in out and "recorded in the library: mlp" in out
    assert read_cells_csv(saved.with_suffix(".csv")) == results.cells

    config = EngineConfig(model=str(tiny_model_dir), device="cpu", max_lora_rank=32)
    with Engine(config) as engine:
        engine.add_adapter("side", tiny_adapters["tiny-r4-qv"])
        engine.add_adapter("mlp", tiny_adapters["tiny-r16-mlp"])
        direct = run_eval(
            engine, load_prompt_set(prompts, "contains"), ["side", "base", "mlp"], EvalSettings(max_tokens=6)
        )
    assert [c.output for c in results.cells] == [c.output for c in direct.cells]
    assert [c.passed for c in results.cells] == [c.passed for c in direct.cells]
    assert results.cell(0, "base").passed is not None  # --check contains applied to row 1

    (record,) = Registry().eval_scores("mlp")
    assert (record.prompt_set, record.passed, record.checked) == ("mine", results.score("mlp").passed, 3)
    assert record.results_path == str(saved)
    assert main(["adapters", "list"]) == 0
    listing = capsys.readouterr().out
    assert "LAST EVAL" in listing and f"mine: {record.passed}/3 passed" in listing
    assert main(["adapters", "show", "mlp", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["evaluations"][0]["prompt_set_digest"] == results.prompt_set_digest


def test_eval_refuses_a_malformed_file_with_its_row(capsys, tiny_model_dir, tmp_path):
    prompts = tmp_path / "bad.jsonl"
    prompts.write_text('{"prompt": "fine"}\n{"prompt": 3}\n')
    assert main(["eval", "--prompts", str(prompts), "--model", str(tiny_model_dir)]) == 1
    assert "bad.jsonl, row 2: 'prompt' must be non-empty text" in capsys.readouterr().err
    assert main(["eval", "--prompts", str(prompts), "--check", "{oops", "--model", str(tiny_model_dir)]) == 1
    assert "--check is a check kind or a JSON object" in capsys.readouterr().err
