"""The Linux installer, end to end: wheel -> private environment -> desktop entry -> app runs -> uninstall.

Runs the real installer into a temporary HOME with the CPU build of PyTorch this machine has
on disk (``--torch torch==2.13.0 --torch-index none``); the rest comes from PyPI.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALLER = ROOT / "installers" / "linux" / "install.sh"
TORCH_SPEC = os.environ.get("MLS_TEST_TORCH_SPEC", "torch==2.13.0")

pytestmark = pytest.mark.slow(seconds=240)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
    )
    (built,) = out.glob("multilora_studio-*.whl")
    return built


def test_wheel_ships_kernels_and_resources(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "multilora_studio/kernels/lora.py",
        "multilora_studio/kernels/paged_attention.py",
        "multilora_studio/resources/icons/multilora-studio.svg",
        "multilora_studio/resources/desktop/multilora-studio.desktop.in",
        "multilora_studio/resources/demo_adapters/demo-pirate/adapter_model.safetensors",
        "multilora_studio/resources/examples/demo-prompts.jsonl",
        "multilora_studio/engine/engine.py",
    ):
        assert required in names, required
    packages = (ROOT / "multilora_studio").rglob("__init__.py")
    for init in packages:  # every package of the source, whatever pyproject.toml lists
        assert init.relative_to(ROOT).as_posix() in names, init
    assert not any(name.startswith(("tests/", "kernels/")) for name in names)


def run_installer(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "MULTILORA_STUDIO_"))}
    env.update(
        HOME=str(home), PIP_CACHE_DIR=os.environ.get("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip"))
    )
    return subprocess.run(
        ["bash", str(INSTALLER), *args], env=env, capture_output=True, text=True, timeout=1500
    )


def files_under(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in root.rglob("*")}


def test_install_run_and_uninstall_leave_nothing_behind(wheel, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    before = files_under(home)
    result = run_installer(
        home,
        "--cpu",
        "--wheel",
        str(wheel),
        "--torch",
        TORCH_SPEC,
        "--torch-index",
        "none",
        "--no-system-libs",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Done." in result.stdout
    venv_python = home / ".local" / "share" / "multilora-studio" / "install" / "venv" / "bin" / "python"
    needed = subprocess.run(
        [str(venv_python), "-I", "-m", "multilora_studio.gui.qt_platform"], capture_output=True, text=True
    ).stdout.strip()
    if needed:  # this machine lacks libraries of Qt's xcb plugin: the installer names the command
        assert f"install them with: sudo {needed}" in result.stdout, result.stdout
    else:
        assert "system libraries" not in result.stdout

    launcher = home / ".local" / "bin" / "multilora-studio"
    desktop = home / ".local" / "share" / "applications" / "multilora-studio.desktop"
    icon = home / ".local" / "share" / "icons" / "hicolor" / "scalable" / "apps" / "multilora-studio.svg"
    assert launcher.is_file() and os.access(launcher, os.X_OK)
    assert icon.is_file()
    entry = desktop.read_text()
    assert f"Exec={launcher} gui" in entry and "StartupWMClass=multilora-studio" in entry
    validator = shutil.which("desktop-file-validate")
    assert validator, "desktop-file-validate is needed (Debian package desktop-file-utils)"
    check = subprocess.run([validator, str(desktop)], capture_output=True, text=True)
    assert check.returncode == 0 and not check.stdout.strip(), check.stdout + check.stderr

    data = tmp_path / "studio-data"
    env = dict(os.environ, HOME=str(home), MULTILORA_STUDIO_HOME=str(data), QT_QPA_PLATFORM="offscreen")
    run = subprocess.run(
        [str(launcher), "gui", "--smoke-test", "--device", "cpu"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "smoke test passed" in run.stdout

    again = run_installer(
        home,
        "--cpu",
        "--wheel",
        str(wheel),
        "--torch",
        TORCH_SPEC,
        "--torch-index",
        "none",
        "--no-system-libs",
    )
    assert again.returncode == 0, again.stdout + again.stderr  # re-running upgrades in place

    removed = run_installer(home, "--uninstall")
    assert removed.returncode == 0, removed.stderr
    left = files_under(home) - before
    tool_state = (".cache", ".rustup", ".cargo")  # pip's cache and toolchains a build may have probed
    assert not [p for p in left if not str(p).startswith(tool_state)], sorted(map(str, left))
    assert data.is_dir(), "user data is kept unless --purge"


def test_installer_explains_a_missing_wheel(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    result = run_installer(home, "--cpu", "--wheel", str(tmp_path / "missing.whl"))
    assert result.returncode == 1
    assert "no app wheel found" in result.stderr


def test_installer_refuses_unknown_options(tmp_path):
    result = run_installer(tmp_path, "--frobnicate")
    assert result.returncode == 1 and "unknown option --frobnicate" in result.stderr
