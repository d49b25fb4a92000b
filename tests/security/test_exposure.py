"""serve refuses flag combinations that would silently drop authentication or the Host check."""

from __future__ import annotations

import socket

import pytest

from multilora_studio.cli import main
from multilora_studio.server import ServerConfig
from multilora_studio.server.exposure import interface_addresses
from tests.server.raw_http import call

KEY = "sk-exposure-test-key"
BASE = ["serve", "--model", "/no/such/model", "--port", "0"]  # refused before the model loads


@pytest.mark.parametrize("keys", [[""], ["  "], ["sk-good-key-123", ""]])
def test_an_empty_api_key_flag_is_refused(capsys, keys):
    flags = [part for key in keys for part in ("--api-key", key)]
    assert main([*BASE, *flags]) == 1
    err = capsys.readouterr().err
    assert "--api-key holds an empty key" in err and "/no/such/model" not in err


@pytest.mark.parametrize("value", ["", ",", "sk-good-key-123,"])
def test_an_empty_api_key_variable_is_refused(capsys, monkeypatch, value):
    monkeypatch.setenv("MULTILORA_STUDIO_API_KEY", value)
    assert main(BASE) == 1
    err = capsys.readouterr().err
    assert "$MULTILORA_STUDIO_API_KEY holds an empty key" in err and "/no/such/model" not in err


def test_a_public_host_without_a_key_is_refused(capsys):
    assert main([*BASE, "--host", "0.0.0.0"]) == 1
    err = capsys.readouterr().err
    assert "0.0.0.0 can be reached from other machines: set an API key" in err and "/no/such/model" not in err


def test_a_public_host_without_allowed_hosts_checks_the_host_against_the_machines_names(serve):
    server = serve(host="0.0.0.0", api_keys=(KEY,))
    port = server.url.rsplit(":", 1)[1]
    url = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {KEY}"}
    assert call(url, "GET", "/v1/models", headers=auth | {"Host": "evil.example"})[0] == 403
    for name in (socket.gethostname(), "127.0.0.1", "localhost", *interface_addresses()):
        host = f"[{name}]" if ":" in name else name
        assert call(url, "GET", "/v1/models", headers=auth | {"Host": f"{host}:{port}"})[0] == 200, name


def test_a_public_host_may_serve_without_a_key_only_when_told_so(serve):
    with pytest.raises(ValueError, match="set an API key"):
        ServerConfig(host="0.0.0.0")
    server = serve(host="0.0.0.0", allow_no_key=True)
    port = server.url.rsplit(":", 1)[1]
    assert call(f"http://127.0.0.1:{port}", "GET", "/v1/models")[0] == 200


def test_a_public_host_with_allowed_hosts_checks_the_host_header(serve):
    server = serve(host="0.0.0.0", allowed_hosts=("studio.lan",), api_keys=(KEY,))
    port = server.url.rsplit(":", 1)[1]
    url = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {KEY}"}
    assert call(url, "GET", "/v1/models", headers=auth | {"Host": "evil.example"})[0] == 403
    assert call(url, "GET", "/v1/models", headers=auth | {"Host": f"studio.lan:{port}"})[0] == 200
