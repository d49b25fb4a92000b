"""Server view: the toggle starts a real endpoint on a free loopback port; real requests show in the log."""

from __future__ import annotations

import socket
from dataclasses import replace

import openai
import pytest

from tests.gui.conftest import save_screenshot

KEY = "sk-studio-test-key-123"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_toggle_serves_the_engine_and_logs_requests(qtbot, open_window, registry, tiny_base, tiny_adapters):
    registry.import_folder(tiny_adapters["tiny-r8-attn"], tiny_base, max_rank=32)
    window = open_window()
    view = window.server
    window.show_page("Server")
    port = free_port()
    view.port.setValue(port)
    view.api_key.setText(KEY)
    view.toggle.click()
    qtbot.waitUntil(lambda: window.control.state == "on", timeout=30_000)
    url = f"http://127.0.0.1:{port}"
    assert view.url.text() == f"{url}/v1"
    assert view.toggle.text() == "Stop server" and not view.port.isEnabled()
    assert f"{url}/v1/chat/completions" in view.curl.toPlainText() and KEY in view.curl.toPlainText()
    assert f'base_url="{url}/v1"' in view.python.toPlainText()
    assert f"endpoint: {url}/v1" in window.status.endpoint.text()

    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=60)
    assert {m.id for m in client.models.list().data} == {"tiny-llama0", "tiny-r8-attn"}
    reply = client.chat.completions.create(
        model="tiny-r8-attn", messages=[{"role": "user", "content": "Hi"}], max_tokens=5, temperature=0
    )
    assert reply.usage.completion_tokens == 5
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="wrong-key-000", max_retries=0).completions.create(
            model="tiny-r8-attn", prompt="Hi", max_tokens=2
        )
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-adapter", prompt="Hi", max_tokens=2)
    qtbot.waitUntil(lambda: any(r["Status"] == "200" for r in view.log_rows()), timeout=10_000)
    served = next(r for r in view.log_rows() if r["Status"] == "200")
    assert served["Model"] == "tiny-r8-attn" and served["Completion tok"] == "5"
    assert served["Route"].startswith("chat") and served["Latency"].endswith("ms")
    qtbot.waitUntil(lambda: any(r["Status"] == "404" for r in view.log_rows()), timeout=10_000)
    save_screenshot(window, "server")

    view.toggle.click()
    qtbot.waitUntil(lambda: window.control.state == "off", timeout=30_000)
    assert view.url.text() == "" and view.port.isEnabled()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2)


def test_bad_server_settings_show_a_message(qtbot, open_window):
    window = open_window()
    view = window.server
    view.api_key.setText("short")
    assert not view.start()
    assert "at least 8 characters" in view.banner.text
    view.api_key.clear()
    view.host_edit.setText("0.0.0.0")
    assert not view.start()
    assert "API key" in view.banner.text
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        view.host_edit.setText("127.0.0.1")
        view.port.setValue(busy.getsockname()[1])
        assert view.start()
        qtbot.waitUntil(lambda: bool(view.banner.text), timeout=30_000)
    assert "already in use" in view.banner.text
    assert window.control.state == "off" and view.toggle.text() == "Start server"


def start_endpoint(qtbot, window) -> openai.OpenAI:
    """Start the window's endpoint with ``KEY`` on a free port; a client of it."""
    view = window.server
    view.port.setValue(free_port())
    view.api_key.setText(KEY)
    view.toggle.click()
    qtbot.waitUntil(lambda: window.control.state == "on", timeout=30_000)
    return openai.OpenAI(base_url=view.url.text(), api_key=KEY, max_retries=0, timeout=60)


def test_the_monitor_shows_the_endpoints_usage_by_tenant(qtbot, open_window, tmp_path):
    window = open_window()
    view = window.server
    client = start_endpoint(qtbot, window)
    base = window.host.engine.model_name
    for _ in range(2):
        client.completions.create(model=base, prompt="Hi", max_tokens=4, temperature=0)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-adapter", prompt="Hi", max_tokens=2)

    monitor = window.monitor
    window.show_page("Monitor")
    monitor.usage.price.setValue(3600.0)  # a dollar per engine second: the cost column is the seconds
    qtbot.waitUntil(lambda: monitor.usage.table.rowCount() == 2, timeout=10_000)
    table = monitor.usage.table
    rows = {
        (table.item(r, 0).text(), table.item(r, 1).text()): [
            table.item(r, c).text() for c in range(table.columnCount())
        ]
        for r in range(table.rowCount())
    }
    served, unknown = rows[("key-1", base)], rows[("key-1", "unknown")]
    assert served[2:5] == ["2", "0", "2 / 0"] and served[7] == "8"  # requests, errors, hot/cold, tokens
    assert unknown[2:4] == ["1", "1"]
    (row,) = [row for row in monitor.usage.rows if row.model == base]
    assert row.engine_seconds > 0 and served[10] == f"{row.engine_seconds:.3f}"
    assert served[11] == f"${row.engine_seconds:.4f}"
    assert "3 requests (0 cold)" in monitor.usage.summary.text()
    exported = monitor.usage.export(tmp_path / "usage.csv").read_text().splitlines()
    assert exported[0].startswith("tenant,model,requests") and len(exported) == 3
    view.toggle.click()
    qtbot.waitUntil(lambda: window.control.state == "off", timeout=30_000)
    monitor.usage.refresh(force=True)
    assert monitor.usage.table.rowCount() == 2  # the counts outlive the server


def test_the_advice_from_the_endpoints_traffic_applies_to_the_engine(
    qtbot, open_window, make_prefs, tiny_choice, registry, tiny_base, tiny_adapters
):
    names = ("tiny-r4-qv", "tiny-r8-all", "tiny-r16-mlp")
    for name in names:
        registry.import_folder(tiny_adapters[name], tiny_base, max_rank=32)
    make_prefs().set_engine_choice(replace(tiny_choice, max_loras=2, max_cpu_loras=4))
    window = open_window()
    client = start_endpoint(qtbot, window)
    for i in range(12):  # three adapters in turn through two slots: every request misses
        client.completions.create(model=names[i % 3], prompt="Hi", max_tokens=1, temperature=0)

    panel = window.monitor.advice
    window.show_page("Monitor")
    panel.advise_button.click()
    qtbot.waitUntil(lambda: panel.advice is not None, timeout=30_000)  # replayed on a task thread
    advice = panel.advice
    assert advice is not None and panel.text.text().startswith("12 requests, 3 adapters")
    assert (advice.recorded.max_loras, advice.recorded.max_cpu_loras) == (2, 4)
    assert advice.recorded.slot_hit_rate == 0.0 and advice.recommended.max_loras >= 3
    assert advice.recommended.slot_hit_rate > 0.5 and panel.apply_button.isEnabled()
    panel.apply_button.click()
    qtbot.waitUntil(lambda: window.host.state == "loading", timeout=10_000)
    qtbot.waitUntil(lambda: window.host.state == "ready", timeout=120_000)
    config = window.host.engine.config
    assert (config.max_loras, config.max_cpu_loras) == (
        advice.recommended.max_loras,
        advice.recommended.max_cpu_loras,
    )
