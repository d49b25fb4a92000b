"""Folders next to a checkpoint: a merge deletes nothing it did not make, and a checkpoint's
shard index reads nothing outside its folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from multilora_studio.checkpoint_files import INDEX_FILE, checkpoint_files
from tests.security.library_checks import one_line_error


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "studio-home"
    monkeypatch.setenv("MULTILORA_STUDIO_HOME", str(folder))
    return folder


def test_a_merge_refuses_an_existing_partial_folder_and_leaves_it(
    capsys, home, tmp_path, tiny_adapters, tiny_model_dir
):
    """``<out>.partial`` may be another merge's work in progress, or the user's own folder."""
    out = tmp_path / "merged"
    partial = tmp_path / "merged.partial"
    partial.mkdir()
    (partial / "notes.txt").write_text("the user's notes\n")
    adapter = str(tiny_adapters["tiny-r8-all"])
    message = one_line_error(capsys, "merge", adapter, "--into-base", str(tiny_model_dir), "--out", str(out))
    assert message.startswith(f"{partial} exists") and "delete it, or choose another folder" in message
    assert (partial / "notes.txt").read_text() == "the user's notes\n" and not out.exists()


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/ABSOLUTE/outside.safetensors", "sub/x", ".."])
def test_an_index_naming_a_shard_outside_its_folder_is_refused(tmp_path, tiny_model_dir, shard):
    """A shard name is a file of the checkpoint folder: not a path up, across or absolute."""
    folder = Path(shutil.copytree(tiny_model_dir, tmp_path / "checkpoint" / "model"))
    shutil.copy(folder / "model.safetensors", folder.parent / "outside.safetensors")  # a readable file
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    shard = shard.replace("/ABSOLUTE", str(folder.parent))
    tensors = ["model.norm.weight", "lm_head.weight"]
    weight_map = {tensors[0]: "model-00001-of-00002.safetensors", tensors[1]: shard}
    (folder / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    with pytest.raises(ValueError, match="an index may name only files in its own folder") as refused:
        checkpoint_files(folder)
    assert repr(shard) in str(refused.value) and str(folder / INDEX_FILE) in str(refused.value)
