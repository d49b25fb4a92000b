"""``multilora-studio watch``: a run's checkpoints imported and scored, the aliases moved, and a
second watch of the same run resumes without importing anything twice."""

from __future__ import annotations

import json

from multilora_studio.adapters.registry import Registry
from multilora_studio.cli import main
from tests.runs.trainer_loop import TrainerLoop

ENGINE_FLAGS = ["--device", "cpu", "--dtype", "float32", "--max-lora-rank", "8", "--max-model-len", "256"]


def test_watch_imports_scores_and_resumes(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MULTILORA_STUDIO_HOME", str(tmp_path / "home"))
    out = tmp_path / "my-run"
    TrainerLoop(tiny_model_dir, out, max_steps=4, save_steps=2, piece_delay_s=0).run()
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "The sky", "reference": " is blue today."}) + "\n")
    watch = ["watch", str(out), "--interval", "0.05", "--exit-when-idle", "--model", str(tiny_model_dir)]
    assert main([*watch, "--prompts", str(prompts), *ENGINE_FLAGS]) == 0
    printed = capsys.readouterr().out
    assert "imported checkpoint-2 as my-run@step-2 (loss" in printed
    assert "imported checkpoint-4 as my-run@step-4" in printed
    assert "scored my-run@step-2" in printed and "my-run@best -> my-run@step-" in printed
    registry = Registry()
    assert [c.adapter for c in registry.checkpoints("my-run")] == ["my-run@step-2", "my-run@step-4"]
    assert registry.get("my-run@latest").name == "my-run@step-4"
    assert registry.run("my-run").prompt_set == str(prompts.resolve())
    assert main([*watch, *ENGINE_FLAGS]) == 0  # the same run again: its prompt set, nothing new
    assert "imported" not in capsys.readouterr().out
    assert len(registry.checkpoints("my-run")) == 2


def test_watch_refuses_a_missing_folder_and_another_runs_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MULTILORA_STUDIO_HOME", str(tmp_path / "home"))
    assert main(["watch", str(tmp_path / "nowhere")]) == 1
    assert "is not a folder" in capsys.readouterr().err
    (tmp_path / "a").mkdir()
    Registry().follow_run("first", tmp_path / "a")
    assert (
        main(["watch", str(tmp_path / "a"), "--name", "second", "--exit-when-idle", "--interval", "0.01"])
        == 1
    )
    assert "already follows" in capsys.readouterr().err
