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


def other_base(tiny_model_dir, target):
    """A copy of the tiny model with one weight changed: other base weights, the same shapes."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(tiny_model_dir, target)
    weights = load_file(target / "model.safetensors")
    name = next(key for key in weights if key.endswith("norm.weight"))
    weights[name] = weights[name] * 1.5
    save_file(weights, target / "model.safetensors", metadata={"format": "pt"})
    return target


def test_eval_rerun_reproduces_the_cells_and_refuses_a_changed_set_or_base(
    capsys, tiny_model_dir, tiny_adapters, monkeypatch, tmp_path
):
    monkeypatch.setenv("MULTILORA_STUDIO_HOME", str(tmp_path / "home"))
    Registry().import_folder(tiny_adapters["tiny-r16-mlp"], describe_base(str(tiny_model_dir)), name="mlp")
    prompts = write_jsonl(tmp_path / "mine.jsonl", ROWS)
    model = ["--model", str(tiny_model_dir), "--device", "cpu"]
    code = main(
        [
            "eval", "--prompts", str(prompts), "--adapters", "side,mlp,base", "--check", "contains", *model,
            "--max-lora-rank", "32", "--max-tokens", "6", "--no-batch-invariant",
            "--lora-modules", f"side={tiny_adapters['tiny-r4-qv']}", "--out", str(tmp_path / "first"),
        ]
    )  # fmt: skip
    assert code == 0
    (first_file,) = (tmp_path / "first").glob("mine-*.json")
    first = read_results_json(first_file)
    assert first.engine is not None and first.engine.batch_invariant is False
    assert first.engine.max_lora_rank == 32 and set(first.adapter_digests) == {"side", "mlp"}
    capsys.readouterr()

    # the adapters come back from the library (mlp) and the recorded folder (side), the rank from the record
    rerun = ["eval", "--rerun", str(first_file), *model, "--out", str(tmp_path / "again"), "--format", "md"]
    assert main(rerun) == 0
    out = capsys.readouterr().out
    total = len(first.cells)
    assert f"rerun of {first_file}: {total} of {total} cells as saved" in out
    (again_file,) = (tmp_path / "again").glob("mine-*.json")
    again = read_results_json(again_file)
    assert again.cells == first.cells and again.settings == first.settings
    assert again.engine == first.engine and again.adapter_digests == first.adapter_digests
    assert again.default_check == {"type": "contains"}
    assert first.engine.describe() in again_file.with_suffix(".md").read_text()

    changed_base = other_base(tiny_model_dir, tmp_path / "other-model")
    assert main(["eval", "--rerun", str(first_file), "--model", str(changed_base), "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert f"the evaluation ran on {first.model} (sha256 {first.base_digest[:12]}); this engine runs" in err
    assert "rerun it on the same base (--model FOLDER" in err

    assert main(["eval", "--rerun", str(first_file), "--max-tokens", "3", "--adapters", "base", *model]) == 1
    assert "--rerun runs the saved adapters and settings; leave out --max-tokens, --adapters" in (
        capsys.readouterr().err
    )
    prompts.write_text(prompts.read_text() + '{"prompt": "One more", "reference": " x"}\n')
    assert main(["eval", "--rerun", str(first_file), *model]) == 1
    assert "mine.jsonl changed since the evaluation" in capsys.readouterr().err
    assert main(["eval", *model]) == 1
    assert (
        "give the prompt set with --prompts FILE (or a saved evaluation with --rerun)"
        in capsys.readouterr().err
    )
