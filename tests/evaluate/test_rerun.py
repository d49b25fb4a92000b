"""Saved evaluations record how they ran and rerun to the same cells; a changed input is refused."""

from __future__ import annotations

import csv
import json
import os
import shutil

import pytest

from multilora_studio.evaluate import (
    BASE,
    EvalResults,
    EvalSettings,
    Rerun,
    changed_cells,
    load_prompt_set,
    read_results_json,
    recent_results,
    run_eval,
    save_results,
    write_export,
)
from multilora_studio.evaluate.rerun import engine_warnings
from multilora_studio.run_records import ADAPTER_WEIGHTS, AdapterDigests, EngineRecord, RunRecord
from multilora_studio.util import sha256_file
from tests.evaluate.conftest import ADAPTERS, write_jsonl

NAMES = [*ADAPTERS, BASE]
ROWS = [
    {"prompt": "Once upon a time", "reference": " there", "check": "contains"},
    {"prompt": "The sky is", "reference": " blue", "check": {"type": "choice", "choices": [" blue", " red"]}},
    {"prompt": "Say a word:", "reference": " hello"},
]
NEW_FIELDS = ("engine", "adapter_digests", "adapter_folders", "prompt_set_path", "default_check")


@pytest.fixture
def prompt_file(tmp_path):
    return write_jsonl(tmp_path / "set.jsonl", ROWS)


@pytest.fixture
def saved(engine, prompt_file, tmp_path):
    results = run_eval(engine, load_prompt_set(prompt_file, "contains"), NAMES, EvalSettings(max_tokens=6))
    return read_results_json(save_results(results, tmp_path / "runs"))


def test_the_saved_results_record_the_engine_digests_and_settings(engine, saved, prompt_file, tiny_adapters):
    assert saved.engine == EngineRecord.of(engine)
    assert saved.engine.batch_invariant is engine.config.batch_invariant is False
    assert saved.engine.dtype == "float32" and saved.engine.max_loras == 4
    assert saved.adapter_digests == {
        name: sha256_file(tiny_adapters[name] / ADAPTER_WEIGHTS) for name in ADAPTERS
    }
    assert saved.adapter_folders == {name: str(tiny_adapters[name]) for name in ADAPTERS}
    assert saved.prompt_set_path == str(prompt_file.resolve())
    assert saved.default_check == {"type": "contains"}
    assert saved.settings["greedy"] is True and saved.settings["seed"] is None
    assert EvalSettings.from_dict(saved.settings) == EvalSettings(max_tokens=6)


def test_a_greedy_rerun_gives_the_same_cells(engine, saved):
    rerun = Rerun.of(saved)
    assert rerun.settings == EvalSettings(max_tokens=6) and rerun.adapters == list(ADAPTERS)
    assert rerun.check_engine(engine, AdapterDigests()) == []
    again = rerun.run(engine)
    assert again.cells == saved.cells and changed_cells(saved, again) == 0
    assert again.default_check == saved.default_check and again.adapter_digests == saved.adapter_digests


def test_a_sampled_run_records_its_seed_and_reruns_to_the_same_samples(engine, prompt_file):
    prompt_set = load_prompt_set(prompt_file)
    first = run_eval(engine, prompt_set, NAMES, EvalSettings(max_tokens=8, temperature=1.5))
    seed = first.settings["seed"]
    assert isinstance(seed, int) and first.settings["greedy"] is False
    again = Rerun.of(first).run(engine)
    assert again.settings["seed"] == seed and again.cells == first.cells
    other = run_eval(engine, prompt_set, NAMES, EvalSettings(max_tokens=8, temperature=1.5, seed=seed + 1))
    assert changed_cells(first, other) > 0  # the seed is what made them equal


def test_a_changed_prompt_set_is_refused(saved, prompt_file, tmp_path):
    prompt_file.write_text(prompt_file.read_text() + json.dumps({"prompt": "One more"}) + "\n")
    with pytest.raises(
        ValueError, match=r"set\.jsonl changed since the evaluation \(sha256 [0-9a-f]{12}, recorded"
    ):
        Rerun.of(saved)
    moved = shutil.move(prompt_file, tmp_path / "elsewhere.jsonl")
    with pytest.raises(ValueError, match="is gone; give its new place with --prompts"):
        Rerun.of(saved)
    with pytest.raises(ValueError, match="changed since the evaluation"):
        Rerun.of(saved, moved)


def test_other_base_weights_and_changed_adapter_weights_are_refused(
    engine, prompt_file, tiny_adapters, tmp_path
):
    copy = shutil.copytree(tiny_adapters[ADAPTERS[0]], tmp_path / "copy")
    engine.add_adapter("copy", copy)
    try:
        saved = run_eval(engine, load_prompt_set(prompt_file), ["copy", BASE], EvalSettings(max_tokens=4))
        other_base = EvalResults.from_dict({**saved.to_dict(), "base_digest": "0" * 64})
        with pytest.raises(
            ValueError, match=r"the evaluation ran on .* \(sha256 000000000000\); this engine runs"
        ):
            Rerun.of(other_base).check_engine(engine, AdapterDigests())
        shutil.copy(tiny_adapters[ADAPTERS[1]] / ADAPTER_WEIGHTS, copy / ADAPTER_WEIGHTS)
        with pytest.raises(ValueError, match="adapter copy's weights changed since the evaluation"):
            Rerun.of(saved).check_engine(engine, AdapterDigests())
        (warning,) = Rerun.of(saved).check_engine(engine, AdapterDigests(), allow_changed_adapters=True)
        assert "outputs may differ" in warning
    finally:
        engine.remove_adapter("copy")
    with pytest.raises(ValueError, match="the engine does not serve copy"):
        Rerun.of(saved).check_engine(engine, AdapterDigests())


def test_engine_differences_are_warnings():
    recorded = EngineRecord("m", "d" * 64, "float32", "cpu", 4, 32, "1.0", batch_invariant=True)
    current = EngineRecord("m", "d" * 64, "bfloat16", "cuda:0", 4, 32, "1.1", batch_invariant=False)
    warnings = engine_warnings(recorded, current)
    assert len(warnings) == 4 and "bfloat16" in warnings[0] and "cuda:0" in warnings[1]
    assert "was batch-invariant, this one is not batch-invariant" in warnings[2]
    assert engine_warnings(recorded, recorded) == []
    assert engine_warnings(None, current) == [
        "the results do not record the engine's dtype, device and batch invariance"
    ]


def test_old_results_files_still_load_export_and_rerun_with_the_prompts_given(
    engine, saved, prompt_file, tmp_path
):
    data = saved.to_dict()
    for key in NEW_FIELDS:
        del data[key]
    for key in ("greedy",):
        del data["settings"][key]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    loaded = read_results_json(old)
    assert loaded.engine is None and loaded.adapter_digests == {} and loaded.prompt_set_path == ""
    assert loaded.cells == saved.cells and loaded.scores == saved.scores
    assert "(engine not recorded)" in write_export(loaded, tmp_path / "old.md").read_text()
    with pytest.raises(ValueError, match="do not record their prompt set's file"):
        Rerun.of(loaded)
    rerun = Rerun.of(loaded, prompt_file)  # old files had no default check recorded: the file's own
    warnings = rerun.check_engine(engine, AdapterDigests())
    assert warnings[0].startswith("the results do not record the engine's")
    assert sum("weights digest; it was not checked" in warning for warning in warnings) == len(ADAPTERS)
    old_engine = {"model_name": "m", "model_digest": "", "dtype": "float32", "device": "cpu", "max_loras": 2,
                  "max_lora_rank": 8, "version": "0.1"}  # fmt: skip
    old_compare = {"record_version": 1, "engine": old_engine, "raw": False, "system_prompt": "",
                   "user_turns": [], "shared": {}, "columns": [], "id": "x", "created": 1.0}  # fmt: skip
    assert RunRecord.from_dict(old_compare).engine.batch_invariant is None
    with pytest.raises(ValueError, match="is not a saved evaluation"):
        read_results_json(write_jsonl(tmp_path / "not.json", [{"prompt": "x"}]))


def test_exports_carry_the_record(saved, tmp_path):
    with write_export(saved, tmp_path / "out.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == len(saved.cells)
    for row, cell in zip(rows, saved.cells, strict=True):
        assert row["adapter_digest"] == saved.adapter_digests.get(cell.adapter, "")
        assert (row["model_digest"], row["dtype"], row["batch_invariant"]) == (
            saved.base_digest,
            "float32",
            "False",
        )
        assert json.loads(row["settings"]) == saved.settings
    markdown = write_export(saved, tmp_path / "out.md").read_text()
    header = markdown.split("| adapter |")[0]
    assert saved.engine is not None and saved.engine.describe() in header
    assert saved.prompt_set_digest in header and "greedy=True" in header
    for name in ADAPTERS:
        assert f"`{name}` sha256 `{saved.adapter_digests[name]}`" in header
    assert read_results_json(write_export(saved, tmp_path / "out.json")) == saved


def test_recent_results_are_the_newest_saved_files_first(saved, tmp_path):
    folder = tmp_path / "runs"
    second = save_results(saved, folder)
    (first,) = (path for path in folder.glob("*.json") if path != second)
    os.utime(first, (1_000_000_000, 1_000_000_000))  # older than the second whatever the clock's resolution
    assert recent_results(folder) == [second, first]
    assert recent_results(folder, limit=1) == [second]
    assert recent_results(tmp_path / "none") == []
