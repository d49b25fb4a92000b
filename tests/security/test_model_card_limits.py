"""Model cards crafted to flood the library with score rows: YAML aliases that repeat one metric
thousands of times, and a model-index past the library's cap. The adapter is still imported,
its card kept; no score of that card is recorded, and the log says why."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from multilora_studio.adapters.registry import Registry
from multilora_studio.adapters.score_import import MAX_CARD_SCORES

# 600 bytes that PyYAML expands to 20 models x 20 results x 30 metrics = 12,000 score rows
METRICS, RESULTS, MODELS = ", ".join(["*m"] * 30), ", ".join(["*r"] * 20), ", ".join(["*model"] * 20)
ALIASES = (
    "---\nlibrary_name: peft\n"
    "x-metric: &m {type: acc, value: 1.0}\n"
    f"x-result: &r {{task: {{type: text-generation}}, dataset: {{name: d, type: d}}, metrics: [{METRICS}]}}\n"
    f"x-model: &model {{name: bomb, results: [{RESULTS}]}}\n"
    f"model-index: [{MODELS}]\n"
    "---\n# an adapter\n"
)


def metrics_card(count: int) -> str:
    """A card whose model-index holds ``count`` metrics, each written out."""
    results = "\n".join(
        f"  - task: {{type: text-generation}}\n    dataset: {{name: set{i}, type: set{i}}}\n"
        f"    metrics: [{{type: acc, value: {i}}}]"
        for i in range(count)
    )
    return f"---\nlibrary_name: peft\nmodel-index:\n- name: many\n  results:\n{results}\n---\n# an adapter\n"


@pytest.fixture
def library(tmp_path: Path) -> Registry:
    return Registry(tmp_path / "library")


def import_with_card(library: Registry, tmp_path: Path, tiny_adapters, tiny_base, card: str, name: str):
    folder = Path(shutil.copytree(tiny_adapters["tiny-r4-qv"], tmp_path / name))
    (folder / "README.md").write_text(card)
    return library.import_folder(folder, tiny_base, name=name)


def test_a_card_with_yaml_aliases_records_no_scores(library, tmp_path, tiny_adapters, tiny_base, caplog):
    with caplog.at_level(logging.WARNING, logger="multilora_studio.adapters.registry"):
        record = import_with_card(library, tmp_path, tiny_adapters, tiny_base, ALIASES, "aliased")
    assert library.eval_scores("aliased") == []
    assert (record.path / "README.md").read_text() == ALIASES  # the card itself is kept
    assert "aliased: no scores recorded from its model card" in caplog.text
    assert "uses YAML aliases (*name)" in caplog.text


def test_a_card_past_the_score_cap_records_none_and_one_at_the_cap_records_all(
    library, tmp_path, tiny_adapters, tiny_base, caplog
):
    with caplog.at_level(logging.WARNING, logger="multilora_studio.adapters.registry"):
        import_with_card(
            library, tmp_path, tiny_adapters, tiny_base, metrics_card(MAX_CARD_SCORES + 1), "over"
        )
    assert library.eval_scores("over") == []
    assert (
        f"holds {MAX_CARD_SCORES + 1} metrics; the library records at most {MAX_CARD_SCORES}" in caplog.text
    )
    import_with_card(library, tmp_path, tiny_adapters, tiny_base, metrics_card(MAX_CARD_SCORES), "at-cap")
    scores = library.eval_scores("at-cap")
    assert len(scores) == MAX_CARD_SCORES
    assert sorted(score.value for score in scores) == list(range(MAX_CARD_SCORES))
