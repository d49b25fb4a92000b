"""serve refuses flag combinations that would silently drop authentication or the Host check."""

from __future__ import annotations

import pytest

from multilora_studio.cli import main
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


def test_a_public_host_without_allowed_hosts_is_refused(capsys):
    assert main([*BASE, "--host", "0.0.0.0", "--api-key", KEY]) == 1
    err = capsys.readouterr().err
    assert "--host 0.0.0.0" in err and "--allowed-hosts" in err and "/no/such/model" not in err


def test_a_public_host_with_allowed_hosts_checks_the_host_header(serve):
    server = serve(host="0.0.0.0", allowed_hosts=("studio.lan",), api_keys=(KEY,))
    port = server.url.rsplit(":", 1)[1]
    url = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {KEY}"}
    assert call(url, "GET", "/v1/models", headers=auth | {"Host": "evil.example"})[0] == 403
    assert call(url, "GET", "/v1/models", headers=auth | {"Host": f"studio.lan:{port}"})[0] == 200
