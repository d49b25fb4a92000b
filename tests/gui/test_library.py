"""Library view on a real registry and engine: import, pin, alias, remove, filter, sort, bad adapters."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from PySide6.QtCore import Qt

from multilora_studio.engine import SamplingParams
from multilora_studio.gui.library_model import COLUMNS
from tests.gui.conftest import save_screenshot, wait_task


def test_import_pin_rename_alias_remove_through_the_view(qtbot, open_window, registry, tiny_adapters):
    window = open_window()
    library = window.library
    window.show_page("Library")
    for name in ("tiny-r4-qv", "tiny-r16-mlp", "tiny-r8-attn"):
        wait_task(qtbot, library.import_folder(tiny_adapters[name]))
        assert library.banner.kind == "success", library.banner.text
    engine = window.host.engine
    assert sorted(library.names()) == ["tiny-r16-mlp", "tiny-r4-qv", "tiny-r8-attn"]
    assert {info.name for info in engine.list_adapters()} == set(library.names())
    row = library.row_of("tiny-r16-mlp")
    assert row["Rank"] == "16"
    assert row["Targets"] == "gate_proj, up_proj, down_proj"
    assert row["Tier"] == "disk"  # served, weights not read yet
    assert row["Base"] == Path(window.host.choice.model).name

    library.table.sortByColumn(COLUMNS.index("Rank"), Qt.SortOrder.DescendingOrder)
    assert library.names() == ["tiny-r16-mlp", "tiny-r8-attn", "tiny-r4-qv"]
    library.filter.setText("MLP")  # case-insensitive, any column
    assert library.names() == ["tiny-r16-mlp"]
    library.filter.clear()

    wait_task(qtbot, library.set_pinned("tiny-r4-qv", True))
    assert registry.get("tiny-r4-qv").pinned
    assert library.row_of("tiny-r4-qv")["Pinned"] == "yes"
    # pinning loads it into a GPU slot, no request needed
    qtbot.waitUntil(lambda: library.row_of("tiny-r4-qv")["Tier"].startswith("GPU slot"), timeout=30_000)
    assert library.select("tiny-r4-qv")
    assert library.pin_button.text() == "Unpin"
    assert "tiny-r4-qv" in library.details.toPlainText()

    wait_task(qtbot, library.add_alias("tiny-r8-attn", "attention-only"))
    assert registry.get("attention-only").name == "tiny-r8-attn"
    assert library.row_of("tiny-r8-attn")["Aliases"] == "attention-only"
    wait_task(qtbot, library.add_alias("tiny-r4-qv", "attention-only"))
    assert library.banner.kind == "error" and "attention-only" in library.banner.text

    wait_task(qtbot, library.rename("tiny-r8-attn", "attention-lora"))
    assert library.banner.kind == "success", library.banner.text
    assert registry.get("attention-lora").aliases == ("attention-only",)
    assert registry.find("tiny-r8-attn") is None
    served = {info.name for info in engine.list_adapters()}
    assert "attention-lora" in served and "tiny-r8-attn" not in served
    out = engine.generate(["Hello"], ["attention-lora"], SamplingParams(max_tokens=3, temperature=0))[0]
    assert out.finish_reason == "length"
    wait_task(qtbot, library.rename("attention-lora", "tiny-r4-qv"))  # taken
    assert library.banner.kind == "error" and "tiny-r4-qv" in library.banner.text
    assert registry.find("attention-lora") is not None
    assert "attention-lora" in {info.name for info in engine.list_adapters()}

    save_screenshot(window, "library")
    copied = registry.get("tiny-r16-mlp").path
    wait_task(qtbot, library.remove("tiny-r16-mlp"))
    assert library.banner.kind == "success"
    assert registry.find("tiny-r16-mlp") is None and not copied.exists()
    assert "tiny-r16-mlp" not in {info.name for info in engine.list_adapters()}
    assert sorted(library.names()) == ["attention-lora", "tiny-r4-qv"]


def test_bad_adapters_show_the_validation_message_and_change_nothing(
    qtbot, open_window, registry, tiny_adapters, tmp_path
):
    window = open_window()
    library = window.library
    window.show_page("Library")
    dora = Path(shutil.copytree(tiny_adapters["tiny-r4-qv"], tmp_path / "dora-adapter"))
    config = json.loads((dora / "adapter_config.json").read_text())
    (dora / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    shutil.copy(dora / "adapter_config.json", pickled / "adapter_config.json")
    (pickled / "adapter_model.bin").write_bytes(b"not loaded")

    cases = [
        (dora, "DoRA"),
        (pickled, "pickle"),
        (tmp_path / "missing", "not a folder"),
        (tiny_adapters["tiny-r4-qv"], "invalid adapter name"),  # with the name given below
    ]
    for folder, expected in cases:
        name = "bad name!" if expected == "invalid adapter name" else None
        wait_task(qtbot, library.import_folder(folder, name))
        assert library.banner.kind == "error"
        assert expected.lower() in library.banner.text.lower(), library.banner.text
        assert "Traceback" not in library.banner.text
        assert registry.list_adapters() == [] and library.names() == []
    assert window.host.engine.list_adapters() == []
    save_screenshot(window, "library-validation-message")
    engine = window.host.engine  # the engine thread is unharmed
    assert engine.generate(["Hello"], [None], None)[0].finish_reason in ("stop", "length")


def test_the_name_column_stays_and_tier_and_pinned_show_at_1280_px(qtbot, open_window, tiny_adapters):
    window = open_window()
    window.resize(1280, 800)
    library = window.library
    window.show_page("Library")
    for name in ("tiny-r4-qv", "tiny-r16-mlp"):
        wait_task(qtbot, library.import_folder(tiny_adapters[name]))
    table = library.table
    width = table.viewport().width()
    for title in ("Name", "Tier", "Pinned"):
        column = COLUMNS.index(title)
        right = table.columnViewportPosition(column) + table.columnWidth(column)
        assert table.columnViewportPosition(column) >= 0 and right <= width, (title, right, width)
    table.horizontalScrollBar().setValue(table.horizontalScrollBar().maximum())
    qtbot.wait(50)
    assert table.horizontalScrollBar().maximum() > 0  # the other columns do scroll at this width
    assert table.columnViewportPosition(0) < 0  # the table's own first column scrolled away
    frozen = table.frozen
    assert frozen.isVisible() and frozen.geometry().left() <= table.frameWidth() + 1
    assert frozen.width() == table.columnWidth(0)
    shown = [frozen.model().index(row, 0).data() for row in range(frozen.model().rowCount())]
    assert sorted(shown) == ["tiny-r16-mlp", "tiny-r4-qv"]
    assert frozen.visualRect(frozen.model().index(0, 0)).isValid()
    save_screenshot(window, "library-1280-scrolled")


def test_merge_and_export_writes_a_model_that_serves_what_base_and_adapter_serve(
    qtbot, open_window, registry, tiny_adapters, tmp_path
):
    from multilora_studio.adapters.registry import MERGED_REVISION
    from multilora_studio.engine import Engine, EngineConfig

    window = open_window()
    library = window.library
    window.show_page("Library")
    for name in ("tiny-r8-all", "tiny-r4-qv"):
        wait_task(qtbot, library.import_folder(tiny_adapters[name]))
    assert library.select("tiny-r8-all")
    dialog = library.open_merge_dialog()
    assert dialog.checked() == [("tiny-r8-all", 1.0)]
    assert dialog.out.text().endswith("tiny-r8-all-merged")

    # nothing checked, then an output folder that exists: refused, nothing runs
    dialog.set_checked({})
    assert dialog.start_merge() is None and "Check the adapter" in dialog.banner.text
    dialog.set_checked({"tiny-r8-all": 1.0})
    dialog.out.setText(str(tmp_path))
    wait_task(qtbot, dialog.start_merge())
    assert dialog.banner.kind == "error" and "already exists" in dialog.banner.text

    # a cancel mid-merge leaves nothing; then the merge itself
    out = tmp_path / "merged"
    dialog.out.setText(str(out))
    dialog.shard_size.setText("1MB")
    task = dialog.start_merge()
    task.cancel()  # the merge checks before every tensor; the inputs' checks alone outlast this call
    wait_task(qtbot, task)
    assert dialog.banner.text == "Merge cancelled; nothing was written."
    assert not out.exists() and not out.with_name("merged.partial").exists()
    wait_task(qtbot, dialog.start_merge())
    assert dialog.banner.kind == "success", dialog.banner.text
    save_screenshot(dialog, "library-merge-dialog")
    (record,) = [b for b in registry.list_base_models() if b.revision == MERGED_REVISION]
    assert record.path == out and (out / "model.safetensors.index.json").is_file()

    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    served = window.host.engine.generate(["Hello there"], ["tiny-r8-all"], greedy)[0]
    config = EngineConfig(model=str(out), device="cpu", dtype="float32", max_model_len=64)
    with Engine(config) as merged_engine:
        merged = merged_engine.generate(["Hello there"], [None], greedy)[0]
    assert merged.token_ids == served.token_ids
