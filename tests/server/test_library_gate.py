"""What ``serve`` takes from the library: active adapters only, the quality gate on their newest
evaluation with counts (a model card's scores, which have none, are not judged, and the log says
so), and the warm ones read into host RAM before any request."""

from __future__ import annotations

import json
import logging

import pytest

from multilora_studio.adapters.registry_schema import EvalScoreRecord
from multilora_studio.cli import main
from tests.library_fixtures import CARD, home_library, served


def score(name: str, passed: int, checked: int = 4) -> EvalScoreRecord:
    return EvalScoreRecord(name, "smoke", "digest", "", checked, checked, passed, None, None, 1.0)


@pytest.fixture
def library(monkeypatch, tmp_path, tiny_adapters, tiny_base):
    folders = {
        "gate-good": tiny_adapters["tiny-r4-qv"],
        "gate-bad": tiny_adapters["tiny-r8-all"],
        "gate-warm": tiny_adapters["tiny-r16-mlp"],
        "gate-gone": tiny_adapters["tiny-r8-attn"],
    }
    registry = home_library(monkeypatch, tmp_path, tiny_base, folders)
    registry.record_eval_scores([score("gate-good", 3), score("gate-bad", 1)])
    registry.record_eval_scores([score("gate-bad", 1), score("gate-good", 2)])  # newer: 50 %
    registry.set_warm("gate-warm")
    registry.retire("gate-gone", "replaced")
    return registry


def test_serve_takes_active_adapters_through_the_gate_and_warms_the_warm_ones(library, engine):
    with served(engine, min_pass_rate=0.5) as (_, added):
        assert sorted(added) == ["gate-good", "gate-warm"]  # 50 % passes a 50 % gate; 25 % does not
        assert "gate-warm" in engine.metrics(fresh=True).cpu_adapters  # read before any request
        assert "gate-good" not in engine.metrics(fresh=True).cpu_adapters  # read on first use
    with served(engine) as (_, added):  # no gate: every active adapter
        assert sorted(added) == ["gate-bad", "gate-good", "gate-warm"]
    assert [e.event for e in library.events("gate-warm")] == ["registered", "warm"]


def test_serve_pins_the_adapters_pinned_in_the_library(library, engine):
    library.set_pinned("gate-good", True)
    with served(engine) as (_, added):
        assert "gate-good" in added and engine.pinned_adapters() == ["gate-good"]


def test_the_gate_is_a_fraction(capsys, library):
    assert main(["serve", "--min-pass-rate", "80", "--no-demo-adapters", "--port", "0"]) == 1
    assert (
        capsys.readouterr().err.strip()
        == "error: --min-pass-rate is a fraction of prompts from 0 to 1, got 80.0"
    )


def test_scores_imported_from_json_reach_the_gate(library, engine, tmp_path, capsys):
    path = tmp_path / "scores.json"
    path.write_text(json.dumps([{"prompt_set": "pipeline-eval", "prompts": 10, "passed": 2}]))
    assert main(["adapters", "import-scores", "gate-warm", str(path)]) == 0
    assert capsys.readouterr().out.strip() == "gate-warm: pipeline-eval 2/10 passed (20%)"
    (latest,) = library.eval_scores("gate-warm")
    assert (latest.prompts, latest.checked, latest.passed, latest.results_path) == (10, 10, 2, str(path))
    with served(engine, min_pass_rate=0.5) as (_, added):
        assert "gate-warm" not in added and "gate-good" in added
    for bad, message in (
        ("{", "not a readable JSON file"),
        ('{"prompts": 3}', "needs an object with a prompt_set name"),
        ('{"prompt_set": "x", "prompts": 3, "passed": 5}', "needs passed <= checked <= prompts"),
        ('{"prompt_set": "x", "prompts": -1}', "must be counts"),
    ):
        path.write_text(bad)
        assert main(["adapters", "import-scores", "gate-warm", str(path)]) == 1
        assert message in capsys.readouterr().err
    assert len(library.eval_scores("gate-warm")) == 1  # nothing recorded from the bad files


def test_scores_without_counts_are_not_judged_by_the_gate_and_it_says_so(library, engine, tmp_path, caplog):
    card = tmp_path / "README.md"
    card.write_text(CARD)
    for name in ("gate-bad", "gate-warm"):  # newer than gate-bad's 25 % evaluation; gate-warm's only one
        assert main(["adapters", "import-scores", name, "--model-card", str(card)]) == 0
    with caplog.at_level(logging.INFO), served(engine, min_pass_rate=0.5) as (_, added):
        assert sorted(added) == ["gate-good", "gate-warm"]  # gate-bad: still judged by its 25 %
        assert "library adapter gate-bad not served: its last evaluation (smoke) passed 25%" in caplog.text
        assert (  # the card's last metric is its newest score
            "library adapter gate-warm served without the quality gate: its scores carry no counts "
            "(HellaSwag: acc_norm 0.615 (no counts)), so the gate has no pass rate to judge"
        ) in caplog.text
        assert "gate-good served without the quality gate" not in caplog.text
