"""``multilora-studio`` opens the window by default; ``gui --smoke-test`` compares on the embedded model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from multilora_studio.adapters.registry import Registry
from multilora_studio.cli.shared import describe_base
from tests.fixtures import AdapterSpec, build_adapter
from tests.gui.conftest import SCREENSHOTS


def studio(*args: str, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "multilora_studio", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_no_subcommand_means_the_window(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    result = studio(env=env, timeout=120)
    assert result.returncode == 1
    assert "no display found" in result.stderr and "Traceback" not in result.stderr


def test_smoke_test_compares_base_and_library_adapters_on_the_embedded_model(default_model, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(default_model.path.parent, target_is_directory=True)
    adapter = build_adapter(
        default_model.path, AdapterSpec("smol-qv", 4, 8, ("q_proj", "v_proj"), 7), tmp_path / "a"
    )
    env = {**os.environ, "MULTILORA_STUDIO_HOME": str(home), "QT_QPA_PLATFORM": "offscreen"}
    Registry(home).import_folder(adapter, describe_base(None), name="smol-qv")
    shot = SCREENSHOTS / "smoke-test.png"
    result = studio("gui", "--smoke-test", "--device", "cpu", "--screenshot", str(shot), env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "smoke test passed: 2 columns in one batched run" in result.stdout
    assert "[base] 24 tokens" in result.stdout and "[smol-qv] 24 tokens" in result.stdout
    assert Path(shot).stat().st_size > 10_000


def test_smoke_test_flag_keeps_the_demo_adapters_out(default_model, tmp_path):
    """A first start with ``--no-demo-adapters`` (and no environment variable) offers none."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(default_model.path.parent, target_is_directory=True)
    env = {**os.environ, "MULTILORA_STUDIO_HOME": str(home), "QT_QPA_PLATFORM": "offscreen"}
    env.pop("MULTILORA_STUDIO_NO_DEMO_ADAPTERS", None)
    result = studio("gui", "--smoke-test", "--device", "cpu", "--no-demo-adapters", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "smoke test passed: 1 columns in one batched run" in result.stdout  # the base alone
    assert Registry(home).list_adapters() == []
