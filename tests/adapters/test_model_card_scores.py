"""Scores from a Hugging Face model card: each metric of its front matter's ``model-index`` is
recorded as a score with its metric and value and no counts (a card gives none), on the command
line, when a folder with a card is imported and when a Hub adapter with one is pulled; a card
that cannot be read is named, and never stops a registration; libraries from before keep their
scores through the migration."""

from __future__ import annotations

import logging
import re
import sqlite3

import pytest

from multilora_studio.adapters.library_errors import LibraryError
from multilora_studio.adapters.pull import pull
from multilora_studio.adapters.registry import Registry
from multilora_studio.adapters.registry_schema import MIGRATIONS, EvalScoreRecord
from multilora_studio.adapters.score_import import read_model_card
from multilora_studio.cli import main
from multilora_studio.util import sha256_file
from tests.adapter_fixtures import BASE_REPO, HUB_ORG
from tests.library_fixtures import CARD, CARD_SCORES, home_library

NO_INDEX = """---
base_model: HuggingFaceTB/SmolLM2-135M-Instruct
library_name: peft
---

# An adapter without evaluation results
"""
NO_DATASET = """---
library_name: peft
model-index:
- name: broken
  results:
  - task:
      type: text-generation
    metrics:
    - type: acc
      value: 0.9
---
"""


def triples(scores: list[EvalScoreRecord]) -> list[tuple[str, str | None, float | None]]:
    return [(s.prompt_set, s.metric, s.value) for s in scores]


def test_each_metric_of_the_model_index_is_a_score_without_counts(tmp_path):
    card = tmp_path / "README.md"
    card.write_text(CARD)
    scores = read_model_card(card, "math", "base-digest")
    assert triples(scores) == CARD_SCORES
    for score in scores:
        assert (score.prompts, score.checked, score.passed, score.pass_rate) == (None, None, None, None)
        assert (score.adapter, score.base_digest, score.results_path) == ("math", "base-digest", str(card))
        assert score.prompt_set_digest == sha256_file(card)
    assert scores[0].label == "GSM8k (5-shot) (main, test): acc 31.46 (no counts)"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (NO_DATASET, "its model-index cannot be read"),
        ("---\nmodel-index: [\n---\n", "its model-index cannot be read"),  # not YAML
        (CARD.replace("value: 31.46", "value: n/a"), "GSM8k (5-shot) acc: 'n/a' is not a number"),
        (CARD.replace("value: 31.46", "value: .nan"), "is not a number"),
    ],
    ids=["no dataset", "broken yaml", "a word", "nan"],
)
def test_a_card_that_cannot_be_read_is_named(tmp_path, text, message):
    card = tmp_path / "README.md"
    card.write_text(text)
    with pytest.raises(LibraryError, match=re.escape(message)) as caught:
        read_model_card(card, "math", "")
    assert str(card) in str(caught.value)


def test_a_card_without_a_model_index_has_no_scores(tmp_path):
    for number, text in enumerate((NO_INDEX, "# Just a title, no front matter\n")):
        card = tmp_path / f"card-{number}.md"
        card.write_text(text)
        assert read_model_card(card, "math", "") == []


def test_importing_a_folder_with_a_card_records_its_scores(
    registry, tiny_base, tiny_adapters, tmp_path, caplog
):
    folder = tmp_path / "with-card"
    folder.mkdir()
    for file in tiny_adapters["tiny-r4-qv"].iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    (folder / "README.md").write_text(CARD)
    record = registry.import_folder(folder, tiny_base, name="math", max_rank=32)
    scores = registry.eval_scores("math")  # newest first: all at once, so by insertion backwards
    assert sorted(triples(scores)) == sorted(CARD_SCORES)
    assert {s.results_path for s in scores} == {str(record.path / "README.md")}  # the library's copy
    assert {s.base_digest for s in scores} == {record.base_digest} and record.base_digest

    (folder / "README.md").write_text(NO_DATASET)
    with caplog.at_level(logging.WARNING):
        registry.import_folder(folder, tiny_base, name="math-broken-card", max_rank=32)  # still registered
    assert registry.eval_scores("math-broken-card") == []
    assert "math-broken-card: no scores recorded from its model card" in caplog.text


def test_pulling_an_adapter_with_a_card_records_its_scores(hub, hub_env, registry, tiny_base, tiny_adapters):
    repo_id = f"{HUB_ORG}/tiny-scored"
    files = {p.name: p for p in tiny_adapters["tiny-r4-qv"].iterdir() if p.name != "README.md"}
    sha = hub.repos.commit(
        repo_id, "v1", {**files, "README.md": CARD.replace("HuggingFaceTB/SmolLM2-135M-Instruct", BASE_REPO)}
    )
    result = pull(repo_id, registry, tiny_base)
    assert result.adapter is not None and result.revision == sha
    scores = registry.eval_scores(repo_id)
    assert sorted(triples(scores)) == sorted(CARD_SCORES)
    assert {s.results_path for s in scores} == {str(result.path / "README.md")}
    assert all(s.checked is None for s in scores)


def test_import_scores_reads_a_model_card_on_the_command_line(
    tiny_base, tiny_adapters, tmp_path, monkeypatch, capsys
):
    home_library(monkeypatch, tmp_path, tiny_base, {"math": tiny_adapters["tiny-r4-qv"]})
    card = tmp_path / "README.md"
    card.write_text(CARD)
    assert main(["adapters", "import-scores", "math", "--model-card", str(card)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[:4] == [
        f"math: {prompt_set}: {metric} {value:g} (no counts)" for prompt_set, metric, value in CARD_SCORES
    ]
    assert "serve --min-pass-rate judges the newest evaluation with counts" in lines[4]
    assert sorted(triples(Registry().eval_scores("math"))) == sorted(CARD_SCORES)

    card.write_text(NO_INDEX)
    assert main(["adapters", "import-scores", "math", "--model-card", str(card)]) == 1
    assert "no model-index results in its front matter; none recorded" in capsys.readouterr().err
    for argv in (["math"], ["math", str(card), "--model-card", str(card)]):
        assert main(["adapters", "import-scores", *argv]) == 1
        assert "give a JSON file or --model-card README.md (one of them)" in capsys.readouterr().err


def test_a_version_8_library_keeps_its_scores_and_takes_scores_without_counts(tmp_path):
    root = tmp_path / "old"
    root.mkdir()
    conn = sqlite3.connect(root / "library.sqlite3")
    conn.executescript(";".join(MIGRATIONS[step] for step in range(1, 9)) + ";PRAGMA user_version = 8;")
    conn.execute(
        "INSERT INTO adapters (id, name, source_kind, source, path, base_name, base_digest, rank, alpha, "
        "targets, size_bytes, created) "
        "VALUES ('x', 'old-one', 'local', '/s', '/p', 'b', '', 4, 8, 'q_proj', 1, 0)"
    )
    conn.execute(
        "INSERT INTO eval_scores (adapter_id, prompt_set, prompt_set_digest, base_digest, prompts, checked, "
        "passed, reference_logprob, results_path, created) "
        "VALUES ('x', 'smoke', 'd', '', 4, 4, 3, -1.25, 'r', 7)"
    )
    conn.commit()
    conn.close()
    registry = Registry(root)
    (kept,) = registry.eval_scores("old-one")
    assert kept == EvalScoreRecord("old-one", "smoke", "d", "", 4, 4, 3, -1.25, "r", 7.0)
    card = EvalScoreRecord(
        "old-one", "HellaSwag", "c", "", None, None, None, None, None, 8.0, "acc_norm", 0.615
    )
    registry.record_eval_scores([card])
    assert registry.eval_scores("old-one") == [card, kept]
    assert registry.latest_eval_scores() == {"old-one": card}
    assert registry.latest_eval_scores(counted=True) == {"old-one": kept}
