"""Merge and export's GGUF exports through the dialog on the tiny model: an adapter written as a
llama.cpp LoRA file and read back, refusals shown as messages, a cancelled merged export."""

from __future__ import annotations

import gguf

from multilora_studio.gui.workflows.merge_outputs import ADAPTER_GGUF, MERGED_GGUF
from tests.fixtures import AdapterSpec, build_adapter
from tests.gui.conftest import save_screenshot, wait_task

DORA = AdapterSpec("tiny-dora", 4, 8, ("q_proj", "v_proj"), 41, (("use_dora", True),))


def test_adapter_exports_as_gguf_and_refusals_show_their_message(
    qtbot, open_window, tiny_adapters, tiny_model_dir, tmp_path
):
    window = open_window()
    library = window.library
    window.show_page("Library")
    wait_task(qtbot, library.import_folder(tiny_adapters["tiny-r4-qv"]))
    wait_task(qtbot, library.import_folder(build_adapter(tiny_model_dir, DORA, tmp_path / DORA.name)))
    assert library.select("tiny-r4-qv")
    dialog = library.open_merge_dialog()
    dialog.output.setCurrentText(ADAPTER_GGUF)
    assert dialog.out.text().endswith("tiny-r4-qv.gguf") and dialog.merge_button.text() == "Export"
    assert not dialog.form.isRowVisible(dialog.gguf_type) and not dialog.form.isRowVisible(dialog.dtype)

    out = tmp_path / "qv.gguf"
    dialog.out.setText(str(out))
    wait_task(qtbot, dialog.start_merge())
    assert dialog.banner.kind == "success", dialog.banner.text
    assert str(out) in dialog.banner.text and str(out.with_suffix(".Modelfile")) in dialog.banner.text
    assert gguf.GGUFReader(str(out)).fields["general.type"].contents() == "adapter"
    save_screenshot(dialog, "library-merge-dialog-gguf")

    # refused before anything runs: two adapters; refused by the export: the file exists, DoRA
    dialog.set_checked({"tiny-r4-qv": 1.0, DORA.name: 1.0})
    assert dialog.start_merge() is None and "Check one adapter" in dialog.banner.text
    dialog.set_checked({"tiny-r4-qv": 1.0})
    dialog.out.setText(str(out))
    wait_task(qtbot, dialog.start_merge())
    assert dialog.banner.kind == "error" and "already exists" in dialog.banner.text
    dialog.set_checked({DORA.name: 1.0})
    dialog.out.setText(str(tmp_path / "dora.gguf"))
    wait_task(qtbot, dialog.start_merge())
    assert dialog.banner.kind == "error" and "DoRA" in dialog.banner.text, dialog.banner.text
    assert "Traceback" not in dialog.banner.text and not (tmp_path / "dora.gguf").exists()

    # the merged model with its type; a cancel leaves nothing
    dialog.set_checked({"tiny-r4-qv": 1.0})
    dialog.output.setCurrentText(MERGED_GGUF)
    dialog.gguf_type.setCurrentText("q8_0")
    assert dialog.form.isRowVisible(dialog.gguf_type) and dialog.out.text().endswith(
        "tiny-r4-qv-merged-q8_0.gguf"
    )
    merged = tmp_path / "merged.gguf"
    dialog.out.setText(str(merged))
    task = dialog.start_merge()
    task.cancel()  # the merge checks before every tensor; the inputs' checks alone outlast this call
    wait_task(qtbot, task)
    assert dialog.banner.text == "Export cancelled; nothing was written."
    assert not merged.exists() and not merged.with_suffix(".Modelfile").exists()
    assert dialog.merge_button.isEnabled() and dialog.output.isEnabled()
