"""Adapter files with deeply nested JSON are a clear 400 / CLI error naming the file, not a 500."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from multilora_studio.cli import main
from tests.server.raw_http import post_json

DEPTH = 200_000  # far past Python's recursion limit, well inside the size limits


def nest_config(folder: Path) -> Path:
    path = folder / "adapter_config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps(config)[:-1] + ', "extra": ' + "[" * DEPTH + "]" * DEPTH + "}")
    return path


def nest_header(folder: Path) -> Path:
    path = folder / "adapter_model.safetensors"
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = raw[8 : 8 + length].decode().rstrip()
    nested = (header[:-1] + ', "__metadata__": ' + "[" * DEPTH + "]" * DEPTH + "}").encode()
    path.write_bytes(struct.pack("<Q", len(nested)) + nested + raw[8 + length :])
    return path


@pytest.fixture(params=[nest_config, nest_header], ids=["adapter_config", "safetensors_header"])
def nested(request, server_adapters, tmp_path) -> tuple[Path, Path]:
    """(folder, the file made too deep) in a copy of a good adapter."""
    folder = Path(shutil.copytree(server_adapters["tiny-r4-qv"], tmp_path / "deep"))
    return folder, request.param(folder)


def test_load_lora_adapter_answers_400_naming_the_file(serve, nested):
    folder, path = nested
    server = serve()
    status, _, body = post_json(
        server.url, "/v1/load_lora_adapter", {"lora_name": "deep", "lora_path": str(folder)}
    )
    assert status == 400 and body["error"]["code"] == "invalid_adapter"
    assert f"{path}: JSON nested too deeply" in body["error"]["message"]


def test_adapters_add_is_one_error_line_naming_the_file(
    nested, tiny_model_dir, tmp_path, monkeypatch, capsys
):
    folder, path = nested
    monkeypatch.setenv("MULTILORA_STUDIO_HOME", str(tmp_path / "home"))
    assert main(["adapters", "add", str(folder), "--model", str(tiny_model_dir)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: ") and f"{path}: JSON nested too deeply" in err
