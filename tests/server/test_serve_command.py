"""``multilora-studio serve``: a real process on a free port, Ctrl+C, and clear errors for bad flags."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import openai
import pytest

from multilora_studio.cli import build_parser, main
from multilora_studio.server import ServerConfig, bind_socket
from tests.server_fixtures import GREEDY

KEY = "sk-serve-test-key-1"


def test_busy_port_fails_before_the_model_loads(capsys):
    taken = bind_socket("127.0.0.1", 0)
    try:
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port), "--model", "/no/such/model"]) == 1
        err = capsys.readouterr().err
        # the port was checked first: loading would have failed on the missing model folder
        assert f"127.0.0.1:{port} is already in use" in err and "/no/such/model" not in err
    finally:
        taken.close()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--port", "70000"], "port must be between 0 and 65535"),
        (["--api-key", "short"], "at least 8 characters"),
        (["--max-in-flight", "0"], "max_in_flight must be an integer >= 1"),
        (["--max-sequences-per-request", "0"], "max_sequences_per_request must be an integer >= 1"),
        (["--lora-modules", "=nothing"], "name=path"),
    ],
)
def test_bad_flags_are_clear_errors(capsys, flags, message):
    assert main(["serve", *flags]) == 1
    assert message in capsys.readouterr().err


def test_the_sequences_per_request_flag_defaults_to_the_window_servers_value():
    args = build_parser().parse_args(["serve"])
    assert args.max_sequences_per_request == ServerConfig().max_sequences_per_request == 256
    given = build_parser().parse_args(["serve", "--max-sequences-per-request", "64"])
    assert given.max_sequences_per_request == 64


def test_serve_process_answers_and_stops_on_ctrl_c(tiny_model_dir, server_adapters, engine_device):
    command = [
        sys.executable, "-m", "multilora_studio", "serve",
        "--model", str(tiny_model_dir), "--device", engine_device, "--dtype", "float32",
        "--max-model-len", "256", "--max-lora-rank", "32", "--port", "0",
        "--lora-modules", f"pirate={server_adapters['tiny-r8-all']}", f"poet={server_adapters['tiny-r4-qv']}",
    ]  # fmt: skip
    # PYTHONFAULTHANDLER: a SIGABRT makes it print every thread's stack (if it does not stop)
    env = os.environ | {"MULTILORA_STUDIO_API_KEY": KEY, "PYTHONFAULTHANDLER": "1"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = process.stdout.readline()
        assert line.startswith("serving ") and "pirate, poet" in line, (line, process.stderr.read())
        url = line.rsplit(" at ", 1)[1].strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        api = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=30)
        assert [m.id for m in api.models.list().data][1:] == ["pirate", "poet"]
        answer = api.completions.create(model="poet", prompt="Hi", max_tokens=4, **GREEDY)
        assert answer.usage.completion_tokens == 4
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url, api_key="sk-wrong-key-99", max_retries=0).models.list()
        process.send_signal(signal.SIGINT)
        try:
            code = process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)
            pytest.fail(
                f"serve still ran 20 s after Ctrl+C; its log and stacks:\n{process.communicate()[1][-6000:]}"
            )
        assert code == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
