"""Evaluate view over a real engine: run, matrix and scores, drill-down, exports, library, cancel, rerun."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import Qt

from multilora_studio.engine import SamplingParams
from multilora_studio.evaluate import BASE, read_cells_csv, read_results_json
from multilora_studio.run_records import ADAPTER_WEIGHTS
from multilora_studio.util import sha256_file
from tests.gui.conftest import save_screenshot

ADAPTERS = ("tiny-r4-qv", "tiny-r8-all")
ROWS = [
    {"prompt": "Once upon a time", "reference": " there", "check": "contains"},
    {"prompt": "The sky is", "reference": " blue", "check": {"type": "choice", "choices": [" blue", " red"]}},
    {"prompt": "Give JSON:", "check": {"type": "json_schema", "schema": {"type": "object"}}},
    {"prompt": "Say a word:", "check": {"type": "regex", "pattern": "[a-z]"}},
]


@pytest.fixture
def library_with_adapters(registry, tiny_base, tiny_adapters):
    for name in ADAPTERS:
        registry.import_folder(tiny_adapters[name], tiny_base, max_rank=32)
    return registry


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "my-prompts.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return path


def test_a_run_fills_the_matrix_scores_drill_down_and_library(
    qtbot, open_window, library_with_adapters, prompt_file, tmp_path
):
    window = open_window()
    window.show_page("Evaluate")
    view = window.evaluate
    names = [BASE, *sorted(ADAPTERS)]
    assert [view.adapters.item(i).data(Qt.ItemDataRole.UserRole) for i in range(3)] == names
    view.path.setText(str(prompt_file))
    view.set_checked(names)
    view.max_tokens.setValue(8)
    view.results_dir = tmp_path / "runs"
    with qtbot.waitSignal(view.runFinished, timeout=120_000):
        qtbot.mouseClick(view.run_button, Qt.MouseButton.LeftButton)
        assert view.running and not view.run_button.isEnabled()
    assert view.banner.text == "", view.banner.text
    results = view.results
    assert results is not None and results.adapters == names
    assert view.progress.value() == 1000

    engine = window.host.engine
    params = SamplingParams(max_tokens=8, temperature=0.0)
    matrix = view.matrix
    assert (matrix.rowCount(), matrix.columnCount()) == (len(ROWS), len(names))
    for row, case in enumerate(ROWS):
        for column, name in enumerate(names):
            (alone,) = engine.generate([case["prompt"]], [None if name == BASE else name], params)
            cell = results.cell(row, name)
            assert cell.output == alone.text
            item = matrix.item(row, column)
            assert item.toolTip() == alone.text
            assert item.data(Qt.ItemDataRole.UserRole) == cell.passed
            tinted = item.background().color()
            if cell.passed is None:
                assert item.background().style() == Qt.BrushStyle.NoBrush
            else:
                assert (tinted.green() > tinted.red()) is cell.passed
    assert {results.cell(r, n).passed for r in range(len(ROWS)) for n in names} >= {True, False}

    for row, score in enumerate(results.scores):
        assert view.scores.item(row, 0).text() == score.adapter
        assert view.scores.item(row, 1).text() == f"{score.passed}/{score.checked}"

    matrix.selectRow(1)
    drill = view.drill_down
    assert "Row 2" in drill.header.text() and "Reference" in drill.header.text()
    visible = [text for text, box in zip(drill.outputs, drill.boxes, strict=True) if not box.isHidden()]
    assert [text.toPlainText() for text in visible] == [c.output for c in results.row_cells(1)]
    assert all("chose" in title.text() for title in drill.titles[: len(names)])

    assert read_cells_csv(view.export(tmp_path / "out.csv")) == results.cells
    assert read_results_json(view.export(tmp_path / "out.json")) == results
    markdown = view.export(tmp_path / "out.md").read_text()
    assert "| adapter | passed |" in markdown and results.cells[0].output in markdown
    assert view.saved is not None and view.saved.parent == tmp_path / "runs"
    assert read_results_json(view.saved) == results
    for name in ADAPTERS:
        (record,) = library_with_adapters.eval_scores(name)
        assert (record.prompt_set, record.passed) == ("my-prompts", results.score(name).passed)
    assert "recorded in the library" in view.summary.text()
    window.resize(1280, 820)
    save_screenshot(window, "evaluate")


def test_cancel_stops_the_run_and_bad_files_show_their_row(
    qtbot, open_window, library_with_adapters, tmp_path
):
    window = open_window()
    window.show_page("Evaluate")
    view = window.evaluate
    many = tmp_path / "many.jsonl"
    many.write_text("".join(json.dumps({"prompt": f"Story number {i}:"}) + "\n" for i in range(40)))
    view.path.setText(str(many))
    view.set_checked([BASE, *ADAPTERS])
    view.max_tokens.setValue(200)
    with qtbot.waitSignal(view.runFinished, timeout=120_000):
        assert view.start()
        qtbot.waitUntil(lambda: view.progress.value() > 0, timeout=60_000)
        qtbot.mouseClick(view.cancel_button, Qt.MouseButton.LeftButton)
    assert view.banner.text == "The evaluation was cancelled."
    assert view.results is None and library_with_adapters.eval_scores(ADAPTERS[0]) == []
    engine = window.host.engine
    qtbot.waitUntil(lambda: engine.metrics().running + engine.metrics().waiting == 0, timeout=60_000)

    bad = tmp_path / "bad.csv"
    bad.write_text("prompt,check\nfine,\nx,fuzzy\n")
    view.path.setText(str(bad))
    with qtbot.waitSignal(view.runFinished, timeout=60_000):
        assert view.start()
    assert "bad.csv, row 2:" in view.banner.text and "fuzzy" in view.banner.text
    assert window.host.state == "ready"


def test_rerun_from_the_recent_list_restores_the_inputs_and_reproduces_the_cells(
    qtbot, open_window, library_with_adapters, prompt_file, tmp_path
):
    window = open_window()
    window.show_page("Evaluate")
    view = window.evaluate
    engine = window.host.engine
    view.results_dir = tmp_path / "runs"
    view.path.setText(str(prompt_file))
    view.set_checked([ADAPTERS[0], BASE])
    view.max_tokens.setValue(6)
    view.default_check.setCurrentIndex(view.default_check.findText("contains"))
    with qtbot.waitSignal(view.runFinished, timeout=120_000):
        assert view.start()
    assert view.banner.text == "", view.banner.text
    first_file = view.saved
    first = read_results_json(first_file)
    assert first.engine is not None and first.engine.model_digest == engine.base_digest
    assert first.engine.batch_invariant is engine.config.batch_invariant
    assert first.adapter_digests == {ADAPTERS[0]: sha256_file(engine_path(engine, ADAPTERS[0]))}
    assert view.recent.count() == 1 and view.recent.item(0).data(Qt.ItemDataRole.UserRole) == str(first_file)

    view.path.setText("")
    view.set_checked([ADAPTERS[1]])
    view.max_tokens.setValue(2)
    view.default_check.setCurrentIndex(0)
    with qtbot.waitSignal(view.runFinished, timeout=120_000):
        view.recent.itemActivated.emit(view.recent.item(0))
        assert view.running and not view.rerun_button.isEnabled()
    assert view.banner.text == "", view.banner.text
    assert view.path.text() == str(prompt_file.resolve())
    assert view.checked_names() == sorted([ADAPTERS[0], BASE])
    assert (view.max_tokens.value(), view.default_check.currentText()) == (6, "contains")
    assert view.results is not None and view.results.cells == first.cells
    total = len(first.cells)
    assert f"Rerun: {total} of {total} cells as saved." in view.summary.text()
    assert view.saved != first_file and read_results_json(view.saved).cells == first.cells
    assert view.recent.item(0).data(Qt.ItemDataRole.UserRole) == str(view.saved)  # newest first

    prompt_file.write_text(prompt_file.read_text() + json.dumps({"prompt": "One more"}) + "\n")
    with qtbot.waitSignal(view.runFinished, timeout=120_000):
        assert view.rerun(first_file)
    assert "changed since the evaluation" in view.banner.text and "my-prompts.jsonl" in view.banner.text
    assert not view.rerun(tmp_path / "missing.json")
    assert "Cannot rerun" in view.banner.text
    assert window.host.state == "ready" and view.rerun_button.isEnabled()


def engine_path(engine, name):
    (info,) = (info for info in engine.list_adapters() if info.name == name)
    return info.path / ADAPTER_WEIGHTS
