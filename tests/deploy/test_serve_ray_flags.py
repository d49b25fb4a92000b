"""``serve``'s scale-out flags (``--ray``, ``--devices``): what they refuse, with the flag named,
before Ray or a model starts; without Ray installed, the one line that says how to install it."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import metadata
from pathlib import Path

import pytest

from multilora_studio.cli import build_parser, main
from multilora_studio.cli.serve_ray import parse_autoscale, ray_serve_options
from multilora_studio.server import ServerConfig
from multilora_studio.util import extra_install_hint

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--model", "a", "--model", "b"], "--ray serves one --model; start one application per base model"),
        (["--devices", "cuda:0,cuda:1"], "--ray does not take --devices: Ray places the replicas"),
        (["--allow-hub-adapters"], "--ray does not take --allow-hub-adapters: Ray places the replicas"),
        (["--autoscale", "4"], "--autoscale takes MIN:MAX replicas, e.g. 1:4; got '4'"),
        (["--autoscale", "3:1"], "autoscaling needs 0 < min <= max replicas, got (3, 1)"),
        (["--replicas", "0"], "--replicas must be >= 1, got 0"),
    ],
)
def test_serve_ray_refuses_with_the_flag_named(capsys, flags, message):
    assert main(["serve", "--ray", "--no-library", *flags]) == 1
    err = capsys.readouterr().err
    assert err.strip() == f"error: {message}", err


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        ("cuda:3", "--devices must exist: cuda:3 does not (0 CUDA GPUs visible)"),
        ("gpu", "--devices must be cpu or cuda:N entries (or auto), got 'gpu'"),
    ],
)
def test_serve_devices_refused_with_the_flag_named(capsys, devices, message):
    assert main(["serve", "--no-library", "--devices", devices]) == 1
    assert capsys.readouterr().err.strip() == f"error: {message}"


def test_replicas_and_autoscale_exclude_each_other(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--ray", "--replicas", "2", "--autoscale", "1:2"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_options_carry_the_flags(tiny_model_dir, tiny_adapters):
    flags = ["serve", "--ray", "--no-library", "--model", str(tiny_model_dir), "--device", "cpu"]
    flags += ["--autoscale", "1:3", "--gpus-per-replica", "0.5", "--max-loras", "2", "--max-cpu-loras", "5"]
    flags += ["--lora-modules", f"qv={tiny_adapters['tiny-r4-qv']}"]
    server = ServerConfig(port=0)
    options = ray_serve_options(build_parser().parse_args(flags), server)
    assert options.autoscaling == (1, 3) and options.gpus_per_replica == 0.5
    assert options.adapters == {"qv": str(tiny_adapters["tiny-r4-qv"])} and options.server is server
    assert (options.engine.model, options.engine.max_loras, options.engine.max_cpu_loras) == (
        str(tiny_model_dir),
        2,
        5,
    )
    assert parse_autoscale(" 2 : 8 ") == (2, 8)


def test_serve_ray_without_ray_says_how_to_install_it_in_one_line(tiny_model_dir):
    without_ray = (
        "import sys; sys.modules['ray'] = None; from multilora_studio.cli import main; sys.exit(main())"
    )
    done = subprocess.run(
        [sys.executable, "-c", without_ray, "serve", "--ray", "--no-library", "--model", str(tiny_model_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith("error: --ray needs Ray Serve (") and line.endswith(extra_install_hint("ray"))


def test_the_extras_hint_names_the_checkout_and_this_versions_wheel():
    installed = metadata("multilora-studio")  # pyproject's name, version and extras
    assert {"ray", "bench"} <= set(installed.get_all("Provides-Extra") or ())
    wheel = f"{installed['Name'].replace('-', '_')}-{installed['Version']}-py3-none-any.whl"
    assert extra_install_hint("ray") == (
        f'pip install -e ".[ray]" in a checkout, or pip install "{wheel}[ray]" with the wheel'
    )
    others = [
        path.relative_to(ROOT)
        for path in (ROOT / "multilora_studio").rglob("*.py")
        if "multilora-studio[" in path.read_text() or "pip install -e" in path.read_text()
    ]
    assert others == [Path("multilora_studio/util.py")], (
        "say an extra's install command with extra_install_hint"
    )
