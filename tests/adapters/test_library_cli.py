"""``multilora-studio pull`` and ``multilora-studio adapters ...`` through ``cli.main``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from multilora_studio.cli import main
from tests.adapter_fixtures import BASE_REPO, HUB_ORG, edit_config
from tests.adapters.hub_server import free_port

LORA = f"{HUB_ORG}/tiny-lora"
REPO_ROOT = Path(__file__).resolve().parents[2]
ACTIONS = ("list", "add", "remove", "pin", "unpin", "show", "search")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "studio-home"
    monkeypatch.setenv("MULTILORA_STUDIO_HOME", str(folder))
    return folder


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def listing(capsys: pytest.CaptureFixture, *extra: str) -> list[dict]:
    code, out, _ = run(capsys, "adapters", "list", "--json", *extra)
    assert code == 0
    return json.loads(out)


@pytest.mark.parametrize("argv", [["pull"], ["adapters"], *(["adapters", a] for a in ACTIONS)])
def test_every_command_has_help(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("usage: multilora-studio " + " ".join(argv))


def test_add_list_show_pin_unpin_remove(home, capsys, tiny_adapters, tiny_model_dir):
    folder = str(tiny_adapters["tiny-r8-all"])
    code, out, _ = run(
        capsys,
        "adapters",
        "add",
        folder,
        "--model",
        str(tiny_model_dir),
        "--name",
        "pirate",
        "--alias",
        "arr",
    )
    assert code == 0 and "added 'pirate': rank 8" in out
    assert (home / "library.sqlite3").is_file()
    code, out, _ = run(capsys, "adapters", "list")
    assert code == 0 and out.splitlines()[0].split()[:5] == ["NAME", "STATE", "RANK", "TARGETS", "SIZE"]
    assert out.splitlines()[1].split()[:3] == ["pirate", "active", "8"]
    (entry,) = listing(capsys)
    assert (entry["name"], entry["aliases"], entry["rank"], entry["pinned"]) == ("pirate", ["arr"], 8, False)
    assert entry["source"] == str(Path(folder).resolve()) and Path(entry["path"]).parent == home / "adapters"
    assert run(capsys, "adapters", "pin", "arr")[:2] == (0, "pinned 'pirate'\n")
    code, out, _ = run(capsys, "adapters", "show", "pirate")
    assert code == 0 and "pinned:" in out and "True" in out.split("pinned:")[1].splitlines()[0]
    assert run(capsys, "adapters", "unpin", "pirate")[0] == 0
    code, out, _ = run(capsys, "adapters", "show", "arr", "--json")
    assert code == 0 and json.loads(out)["pinned"] is False
    assert run(capsys, "adapters", "remove", "pirate")[:2] == (0, "removed 'pirate'\n")
    code, out, _ = run(capsys, "adapters", "list")
    assert code == 0 and "the library is empty" in out
    assert list((home / "adapters").iterdir()) == []


def test_a_dora_adapter_is_added_and_listed_with_its_kind(home, capsys, peft_variants, tiny_model_dir):
    code, out, _ = run(capsys, "adapters", "add", str(peft_variants["dora"]), "--model", str(tiny_model_dir))
    assert code == 0 and "rank 4 (DoRA)" in out
    code, out, _ = run(capsys, "adapters", "list")
    assert code == 0 and "4 (DoRA)" in out
    assert [entry["kind"] for entry in listing(capsys)] == ["DoRA"]


def test_list_and_show_flag_an_adapter_of_other_base_weights(
    home, capsys, tiny_adapters, tiny_model_dir, retrained_base
):
    assert (
        run(capsys, "adapters", "add", str(tiny_adapters["tiny-r4-qv"]), "--model", str(tiny_model_dir))[0]
        == 0
    )
    code, out, _ = run(capsys, "adapters", "list", "--model", str(retrained_base))
    assert code == 0 and "(!)" in out and "refused unless overridden" in out
    code, out, _ = run(capsys, "adapters", "show", "tiny-r4-qv", "--json", "--model", str(retrained_base))
    assert json.loads(out)["base_status"] == "mismatch"
    assert listing(capsys, "--model", str(tiny_model_dir))[0]["base_status"] == "ok"


def test_errors_are_one_clear_line_and_change_nothing(home, capsys, tiny_adapters, tiny_model_dir, tmp_path):
    model = str(tiny_model_dir)
    saved_head = shutil.copytree(tiny_adapters["tiny-r4-qv"], tmp_path / "saved-head")
    edit_config(saved_head, modules_to_save=["score"])
    assert (
        run(capsys, "adapters", "add", str(tiny_adapters["tiny-r4-qv"]), "--model", model, "--name", "kept")[
            0
        ]
        == 0
    )
    r8, r32 = str(tiny_adapters["tiny-r8-all"]), str(tiny_adapters["tiny-r32-ko-down"])
    cases = [
        (["adapters", "add", str(tmp_path / "missing"), "--model", model], "is not a folder"),
        (
            ["adapters", "add", str(saved_head), "--model", model],
            "modules_to_save names 'score'; only embed_tokens and lm_head are served",
        ),
        (["adapters", "add", r8, "--model", model, "--name", "kept"], "already has"),
        (["adapters", "add", r8, "--model", str(tmp_path / "nomodel")], "does not exist"),
        (["adapters", "add", r32, "--model", model, "--max-lora-rank", "16"], "exceeds --max-lora-rank=16;"),
        (["adapters", "remove", "nope"], "no adapter named 'nope'"),
        (["adapters", "pin", "nope"], "no adapter named 'nope'"),
        (["adapters", "show", "nope"], "no adapter named 'nope'"),
        (["pull", "not a repo"], "not a Hub repository id"),
    ]
    for argv, message in cases:
        code, out, err = run(capsys, *argv)
        assert code == 1 and out == "", argv
        assert err.startswith("error: ") and message in err, (argv, err)
    assert [entry["name"] for entry in listing(capsys)] == ["kept"]
    assert len(list((home / "adapters").iterdir())) == 1
    with pytest.raises(SystemExit) as exit_:
        main(["adapters"])
    assert exit_.value.code == 2


def test_pull_and_search_through_the_command_line(hub, hub_env, home, capsys, tiny_model_dir):
    model = str(tiny_model_dir)
    v1 = hub.repos.shas[(LORA, "v1")]
    code, out, err = run(capsys, "pull", f"{LORA}@v1", "--model", model, "--name", "lora-v1")
    assert code == 0 and out == f"{LORA}@{v1}: added to the library as 'lora-v1'\n"
    assert "[100.0%]" in err
    code, out, _ = run(capsys, "pull", f"{LORA}@v1", "--model", model)
    assert code == 0 and "already in the library as 'lora-v1'" in out
    code, _, err = run(capsys, "pull", f"{HUB_ORG}/nope", "--model", model)
    assert code == 1 and "was not found" in err
    code, out, _ = run(capsys, "pull", BASE_REPO)
    assert code == 0 and "use it with: --model" in out
    code, out, _ = run(capsys, "adapters", "search", "--base", BASE_REPO, "r8")
    assert code == 0 and out.split()[0] == f"{HUB_ORG}/tiny-r8-all"
    code, out, _ = run(capsys, "adapters", "search", "--base", "nobody/nothing")
    assert code == 0 and "no adapters of nobody/nothing found" in out
    (entry,) = listing(capsys)
    assert (entry["source"], entry["revision"], entry["requested_revision"]) == (LORA, v1, "v1")


def test_offline_pull_in_a_new_process_uses_the_cache(
    hub, hub_env, home, capsys, tiny_model_dir, tmp_path, monkeypatch
):
    assert run(capsys, "pull", f"{LORA}@v1", "--model", str(tiny_model_dir))[0] == 0
    offline_home = tmp_path / "offline-home"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}",  # nothing listens: the cache must suffice
        "HF_HUB_CACHE": str(hub_env.cache_dir),
        "MULTILORA_STUDIO_HOME": str(offline_home),
        "PYTHONPATH": str(REPO_ROOT),
    }
    command = [sys.executable, "-m", "multilora_studio", "pull", "--model", str(tiny_model_dir)]
    done = subprocess.run([*command, f"{LORA}@v1"], check=False, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "added to the library" in done.stdout
    missing = subprocess.run(
        [*command, f"{HUB_ORG}/tiny-r8-all"], check=False, env=env, capture_output=True, text=True
    )
    assert missing.returncode == 1 and "not in the HF cache" in missing.stderr
    monkeypatch.setenv("MULTILORA_STUDIO_HOME", str(offline_home))
    assert [entry["revision"] for entry in listing(capsys)] == [hub.repos.shas[(LORA, "v1")]]
