"""Exports read back into the results; the library records each adapter's scores in one transaction."""

from __future__ import annotations

import json
import sqlite3

import pytest

from multilora_studio.adapters.registry import LibraryError, Registry
from multilora_studio.adapters.registry_schema import MIGRATIONS, SCHEMA_VERSION, EvalScoreRecord
from multilora_studio.evaluate import (
    BASE,
    EvalSettings,
    load_prompt_set,
    read_cells_csv,
    read_results_json,
    record_scores,
    run_eval,
    save_results,
    write_export,
)
from tests.evaluate.conftest import ADAPTERS, write_jsonl

ROWS = [
    {"prompt": "Once upon a time", "reference": " there", "check": "contains"},
    {"prompt": 'He said "hi",\nthen', "check": {"type": "regex", "pattern": "."}},
    {"prompt": "Pick one:", "reference": " yes", "check": {"type": "choice", "choices": [" yes", " no"]}},
]


@pytest.fixture(scope="module")
def results(engine, tmp_path_factory):
    path = write_jsonl(tmp_path_factory.mktemp("sets") / "small.jsonl", ROWS)
    return run_eval(engine, load_prompt_set(path), [*ADAPTERS, BASE], EvalSettings(max_tokens=8))


def test_csv_and_json_exports_read_back_equal(results, tmp_path):
    assert read_cells_csv(write_export(results, tmp_path / "out.csv")) == results.cells
    again = read_results_json(write_export(results, tmp_path / "out.json"))
    assert again == results
    assert again.score(BASE).pass_rate == results.score(BASE).pass_rate
    saved = save_results(results, tmp_path / "runs")
    assert saved.parent == tmp_path / "runs" and saved.name.startswith("small-")
    assert read_results_json(saved) == results
    assert save_results(results, tmp_path / "runs") != saved  # a second save never overwrites
    data = json.loads(saved.read_text())
    assert data["scores"][0]["pass_rate"] == results.scores[0].pass_rate


def test_markdown_has_the_scores_and_every_output(results, tmp_path):
    text = write_export(results, tmp_path / "out.md").read_text()
    for score in results.scores:
        assert f"| {score.adapter} | {score.passed}/{score.checked} |" in text
    for cell in results.cells:
        assert cell.output in text
    assert "## Row 3" in text and "chose" in text
    with pytest.raises(ValueError, match="unknown export format 'txt'"):
        write_export(results, tmp_path / "out.txt")


def test_save_results_defaults_to_the_user_data_dir(results, isolated_home):
    assert save_results(results).parent == isolated_home / "evaluations"


@pytest.fixture
def library(tmp_path, tiny_adapters, tiny_model_dir):
    from multilora_studio.cli.shared import describe_base

    registry = Registry(tmp_path / "library")
    base = describe_base(str(tiny_model_dir))
    for name in ADAPTERS:
        registry.import_folder(tiny_adapters[name], base, max_rank=32)
    return registry


def test_scores_are_recorded_and_read_back_from_the_sqlite_file(results, library, tmp_path):
    assert record_scores(library, results, tmp_path / "r.json") == list(ADAPTERS)  # not the base
    reopened = Registry(library.root)  # a new connection to the same file
    for name in ADAPTERS:
        (record,) = reopened.eval_scores(name)
        score = results.score(name)
        assert record == EvalScoreRecord(
            adapter=name,
            prompt_set="small",
            prompt_set_digest=results.prompt_set_digest,
            base_digest=results.base_digest,
            prompts=3,
            checked=3,
            passed=score.passed,
            reference_logprob=score.reference_logprob_per_token,
            results_path=str(tmp_path / "r.json"),
            created=results.created,
        )
        assert record.pass_rate == score.pass_rate
    record_scores(library, results)
    assert len(reopened.eval_scores(ADAPTERS[0])) == 2
    assert set(reopened.latest_eval_scores()) == set(ADAPTERS)
    reopened.remove(ADAPTERS[0])  # an adapter's scores go with it
    assert set(reopened.latest_eval_scores()) == {ADAPTERS[1]}


def test_a_failed_record_writes_nothing(results, library):
    good = EvalScoreRecord(ADAPTERS[0], "s", "d" * 64, "", 1, 1, 1, None, None, 1.0)
    with pytest.raises(LibraryError, match="no adapter named 'gone'"):
        library.record_eval_scores([good, EvalScoreRecord("gone", "s", "d", "", 1, 1, 0, None, None, 1.0)])
    assert library.eval_scores(ADAPTERS[0]) == []
    with sqlite3.connect(library.db_path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM eval_scores").fetchone() == (0,)


def test_a_version_1_library_is_migrated_and_keeps_its_adapters(tmp_path):
    root = tmp_path / "old"
    root.mkdir()
    conn = sqlite3.connect(root / "library.sqlite3")
    conn.executescript(MIGRATIONS[1] + "PRAGMA user_version = 1;")
    conn.execute(
        "INSERT INTO adapters (id, name, source_kind, source, path, base_name, base_digest, rank, alpha, "
        "targets, size_bytes, created) "
        "VALUES ('x', 'old-one', 'local', '/s', '/p', 'b', '', 4, 8, 'q_proj', 1, 0)"
    )
    conn.commit()
    conn.close()
    registry = Registry(root)
    with sqlite3.connect(registry.db_path) as check:
        assert check.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    assert registry.get("old-one").kind == "LoRA"  # the kind column's default for older libraries
    assert registry.get("old-one").state == "active" and registry.events("old-one") == []
    registry.record_eval_scores([EvalScoreRecord("old-one", "s", "d", "", 2, 2, 1, -1.5, None, 5.0)])
    assert registry.eval_scores("old-one")[0].pass_rate == 0.5
