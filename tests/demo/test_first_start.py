"""A first start offers the shipped demo adapters: ``adapters list``, ``compare``, ``eval`` (the demo
prompt set) and ``serve``.

Each test starts from a new user's empty library (``new_user_home``) on the embedded model.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from multilora_studio.cli import adapters as adapters_command
from multilora_studio.cli import main
from multilora_studio.demo import OFFERED_FILE, SKIP_ENV, demo_prompt_set, read_index
from multilora_studio.evaluate import read_results_json

DEMO = sorted(entry["name"] for entry in read_index()["adapters"])
SUMMARIES = {entry["name"]: entry["summary"] for entry in read_index()["adapters"]}


def listing(capsys: pytest.CaptureFixture, *extra: str) -> list[dict]:
    assert main(["adapters", "list", "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def upper_share(text: str) -> float:
    letters = [c for c in text if c.isalpha()]
    return sum(c.isupper() for c in letters) / max(1, len(letters))


def test_adapters_list_offers_the_demo_adapters_once(new_user_home, capsys, monkeypatch, default_model):
    entries = listing(capsys)
    assert sorted(entry["name"] for entry in entries) == DEMO
    for entry in entries:
        assert entry["notes"] == SUMMARIES[entry["name"]]
        assert (entry["base_name"], entry["base_digest"]) == (default_model.name, default_model.digest)
        assert Path(entry["path"]).parent == new_user_home / "adapters"  # copied into the library
    assert listing(capsys, "--model", str(default_model.path))[0]["base_status"] == "ok"

    assert main(["adapters", "remove", "demo-pirate"]) == 0
    capsys.readouterr()
    marker = new_user_home / OFFERED_FILE
    written = marker.stat().st_mtime_ns
    described: list[str | None] = []
    describe = adapters_command.describe_base

    def counted(model: str | None):
        described.append(model)
        return describe(model)

    monkeypatch.setattr(adapters_command, "describe_base", counted)  # the name `adapters list` calls
    assert sorted(entry["name"] for entry in listing(capsys)) == [n for n in DEMO if n != "demo-pirate"]
    assert described == [], "a second start does not describe the base model"
    assert marker.stat().st_mtime_ns == written, "a second start writes nothing"


def test_the_flag_and_the_variable_skip_the_demo_adapters(new_user_home, capsys, monkeypatch):
    assert main(["adapters", "list", "--no-demo-adapters"]) == 0
    assert "the library is empty" in capsys.readouterr().out
    monkeypatch.setenv(SKIP_ENV, "1")
    assert listing(capsys) == []
    assert not (new_user_home / OFFERED_FILE).exists(), "skipping is not remembered as offered"
    monkeypatch.setenv(SKIP_ENV, "0")
    assert sorted(entry["name"] for entry in listing(capsys)) == DEMO


def test_compare_runs_a_demo_adapter_on_a_first_start(new_user_home, capsys):
    argv = ["compare", "--json", "--device", "cpu", "--dtype", "float32", "--max-model-len", "256"]
    prompt = "Why do leaves change color in autumn?"
    assert main([*argv, "--max-tokens", "16", "--prompt", prompt, "--adapters", "demo-shout,base"]) == 0
    shout, base = json.loads(capsys.readouterr().out)
    assert (shout["adapter"], base["adapter"]) == ("demo-shout", "base")
    assert upper_share(shout["text"]) >= 0.8, shout["text"]
    assert upper_share(base["text"]) < 0.3, base["text"]


def test_eval_runs_the_demo_prompt_set_through_the_base_and_the_demo_adapters(new_user_home, capsys):
    argv = ["eval", "--prompts", "demo", "--device", "cpu", "--max-model-len", "256", "--max-tokens", "4"]
    assert main([*argv, "--no-batch-invariant", "--out", str(new_user_home / "runs")]) == 0
    out = capsys.readouterr().out
    assert "model: SmolLM2-135M-Instruct   prompt set: demo-prompts (6 prompts)" in out
    (saved,) = (new_user_home / "runs").glob("demo-prompts-*.json")
    results = read_results_json(saved)
    assert results.adapters == ["base", *(entry["name"] for entry in read_index()["adapters"])]
    assert results.prompt_set_path == str(demo_prompt_set().resolve())
    assert results.prompts[0].check == {"type": "regex", "pattern": "^Arr!"}  # the pirate's opener
    assert results.cell(0, "demo-pirate").passed and not results.cell(0, "base").passed


def test_serve_lists_the_demo_adapters_in_v1_models(new_user_home):
    command = [
        sys.executable, "-m", "multilora_studio", "serve", "--device", "cpu", "--dtype", "float32",
        "--max-model-len", "256", "--port", "0",
    ]  # fmt: skip
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    assert process.stdout is not None and process.stderr is not None
    try:
        line = process.stdout.readline()
        assert line.startswith("serving SmolLM2-135M-Instruct, "), (line, process.stderr.read())
        url = line.rsplit(" at ", 1)[1].strip()
        api = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=30)
        models = api.models.list().data
        assert [m.id for m in models] == ["SmolLM2-135M-Instruct", *DEMO]
        assert {getattr(m, "parent", None) for m in models[1:]} == {"SmolLM2-135M-Instruct"}
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
