"""An adapter's chat template that loops, floods or eats memory: its renders end at their deadline,
the server keeps answering, renders past the renderers are refused as busy, and ``serve`` still
stops on SIGTERM."""

from __future__ import annotations

import copy
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from multilora_studio.engine.text.template_sandbox import (
    RENDER_DEADLINE_S,
    TemplateBusy,
    TemplateLimitError,
    TemplateSandbox,
)
from multilora_studio.server.prompt_errors import prompt_error
from tests.security.health_watch import HealthWatch
from tests.server.raw_http import post_json
from tests.server_fixtures import GREEDY, client
from tests.threads import CheckedThread

# 100 million loop turns: well over the deadline however fast the machine (at 50 ns a turn,
# 5 s), yet it ends, so that a server without a deadline is measured rather than hung.
SLOW = "{% for a in range(10000) %}{% for b in range(10000) %}{% endfor %}{% endfor %}{{ messages[0].role }}"
ENDLESS = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
FLOOD = "{% for a in range(50000) %}{{ 'flood' * 20 }}{% endfor %}"  # 5 MB of text
HUGE = "{{ 'x' * 100000000000 }}"
CHAT = [{"role": "user", "content": "Hello"}]
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


def with_template(source: Path, folder: Path, template: str) -> Path:
    shutil.copytree(source, folder)
    (folder / "chat_template.jinja").write_text(template)
    return folder


@pytest.fixture
def templated(engine, server_adapters, tmp_path):
    """Add an adapter whose folder brings ``template`` as its chat template; removed afterwards."""
    added: list[str] = []

    def add(name: str, template: str) -> str:
        engine.add_adapter(name, with_template(server_adapters["tiny-r4-qv"], tmp_path / name, template))
        added.append(name)
        return name

    yield add
    for name in added:
        engine.remove_adapter(name)


@pytest.mark.parametrize("tools", [None, TOOLS], ids=["plain", "tools"])
def test_a_slow_template_ends_at_its_deadline_while_health_answers(serve, templated, tools):
    model = templated("slow-template", SLOW)
    server = serve()
    api = client(server)
    extra = {"tools": tools} if tools else {}
    with HealthWatch(server.url) as watch:
        started = time.monotonic()
        try:
            api.chat.completions.create(model=model, messages=CHAT, max_tokens=2, **extra)
            refused = None
        except openai.BadRequestError as error:
            refused = error.body
        took = time.monotonic() - started
    watch.check()
    assert refused is not None and refused["param"] == "messages"
    assert f"did not finish rendering within {RENDER_DEADLINE_S:g} s" in refused["message"]
    assert took < RENDER_DEADLINE_S * 2 + 10  # the deadline, not the template, ends it
    done = api.completions.create(model=model, prompt="Hello", max_tokens=2, **GREEDY)
    assert done.usage.completion_tokens == 2  # the adapter itself still serves


def test_templates_that_flood_or_eat_memory_are_refused_naming_the_cap(serve, templated):
    server = serve()
    flood, huge = templated("flood-template", FLOOD), templated("huge-template", HUGE)
    status, _, body = post_json(server.url, "/tokenize", {"model": flood, "messages": CHAT})
    assert status == 400 and body["error"]["param"] == "messages"
    assert "characters; an adapter's template may write at most 32768" in body["error"]["message"]
    status, _, body = post_json(server.url, "/v1/chat/completions", {"model": huge, "messages": CHAT})
    assert status == 400 and body["error"]["param"] == "messages"
    assert "MiB of memory to render" in body["error"]["message"]


def test_renders_past_the_renderers_are_busy_and_the_renderer_comes_back(engine):
    """One renderer, three endless renders a moment apart: the first ends at its deadline, and
    a render that cannot get the renderer within the deadline is refused as busy (a 503 to
    retry) instead of queueing behind templates; afterwards a new renderer renders."""
    endless, plain = copy.deepcopy(engine.tokenizer), copy.deepcopy(engine.tokenizer)
    endless.chat_template, plain.chat_template = ENDLESS, "{{ messages[0]['content'] }}"
    sandbox = TemplateSandbox(max_model_len=256, deadline_s=1.0, workers=1)
    outcomes: dict[int, tuple[str, float]] = {}

    def render(number: int) -> None:
        started = time.monotonic()
        try:
            sandbox.render(endless, CHAT)
            outcome = "rendered"
        except TemplateLimitError:
            outcome = "deadline"
        except TemplateBusy as error:
            outcome = "busy"
            answer = prompt_error(error, "messages")
            assert (answer.status, answer.headers) == (503, {"Retry-After": "1"})
        outcomes[number] = (outcome, time.monotonic() - started)

    try:
        assert sandbox.render(plain, CHAT) == "Hello"  # the renderer is started and idle
        threads = [CheckedThread(render, number) for number in range(3)]
        for thread in threads:
            thread.start()
            time.sleep(0.1)
        for thread in threads:
            thread.join()
        kinds = [outcomes[number][0] for number in range(3)]
        assert kinds[0] == "deadline" and "busy" in kinds and "rendered" not in kinds, outcomes
        assert all(took < 5.0 for kind, took in outcomes.values() if kind == "busy"), outcomes
        assert sandbox.render(plain, CHAT) == "Hello"  # the killed renderer was replaced
    finally:
        sandbox.close()


@pytest.mark.timeout(180)
def test_serve_stops_on_sigterm_while_a_template_loops(
    tiny_model_dir, server_adapters, tmp_path, engine_device
):
    endless = with_template(server_adapters["tiny-r4-qv"], tmp_path / "endless", ENDLESS)
    command = [
        sys.executable, "-m", "multilora_studio", "serve", "--no-library", "--no-demo-adapters",
        "--model", str(tiny_model_dir), "--device", engine_device, "--dtype", "float32",
        "--max-model-len", "256", "--max-lora-rank", "32", "--port", "0",
        "--lora-modules", f"endless={endless}",
    ]  # fmt: skip
    env = os.environ | {"PYTHONFAULTHANDLER": "1"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = process.stdout.readline()
        assert line.startswith("serving "), (line, process.stderr.read())
        url = line.rsplit(" at ", 1)[1].strip().removesuffix("/v1")
        ask = {"model": "endless", "messages": CHAT}
        with HealthWatch(url) as watch:
            status, _, body = post_json(url, "/v1/chat/completions", ask)
        watch.check()
        assert status == 400 and "did not finish rendering" in body["error"]["message"]
        stalled = CheckedThread(lambda: post_json(url, "/v1/chat/completions", ask))
        stalled.start()
        time.sleep(0.5)  # the second render is under way
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)
            pytest.fail(f"serve still ran 30 s after SIGTERM:\n{process.communicate()[1][-6000:]}")
        assert code == 0
        stalled.join()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
