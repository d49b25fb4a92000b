"""Smaller gaps: connections from many addresses, CORS for every origin, scoped keys and the
tokenizer routes, keys on the command line."""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

import pytest

from multilora_studio.cli import main
from multilora_studio.server import ServerConfig
from multilora_studio.server.api_keys import USER, ApiKey
from tests.security.raw_sockets import get, open_socket, parse_response, read_response, read_to_close
from tests.server.raw_http import call, post_json

KEY = "sk-gaps-test-key-01"
TEAM_A = ApiKey("sk-team-a-key-0001", USER, ("tiny-r4-*",), "team-a")
EVERY_MODEL_USER = ApiKey("sk-any-model-user1", USER)
BASE_FLAGS = ["serve", "--model", "/no/such/model", "--port", "0"]  # refused before the model loads


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_connections_from_many_addresses_meet_one_cap(serve):
    server = serve(max_connections_per_client=4, max_connections=8, header_timeout_s=60)
    host = urlsplit(server.url).netloc
    held = [open_socket(server.url, source=f"127.0.0.{n}") for n in (2, 3) for _ in range(4)]
    try:
        for sock in held:  # all eight are served
            sock.sendall(get("/health", host))
            assert parse_response(read_response(sock))[0] == 200
        with open_socket(server.url, source="127.0.0.4") as excess:  # under its own address's cap
            status, headers, body = parse_response(read_to_close(excess))
        assert (status, body["error"]["code"]) == (503, "too_many_connections")
        assert headers["retry-after"] == "1"
    finally:
        for sock in held:
            sock.close()


def test_every_origin_needs_a_key(capsys):
    with pytest.raises(ValueError, match="allowed origins '\\*' let every web page"):
        ServerConfig(cors_origins=("*",))
    assert ServerConfig(cors_origins=("*",), api_keys=(KEY,)).cors_origins == ("*",)
    assert main([*BASE_FLAGS, "--allowed-origins", "*"]) == 1
    assert "allowed origins '*' let every web page" in capsys.readouterr().err


def test_a_scoped_key_reaches_no_other_tokenizer(serve, engine):
    server = serve(api_keys=(KEY, TEAM_A, EVERY_MODEL_USER))
    team = auth(TEAM_A.secret)
    for route, payload in (("/tokenize", {"prompt": "Hello"}), ("/detokenize", {"tokens": [1, 2]})):
        for model in (None, engine.model_name, "tiny-r8-all"):
            given = payload if model is None else {**payload, "model": model}
            status, _, body = post_json(server.url, route, given, team)
            assert (status, body["error"]["param"]) == (404, "model"), (route, model)
        status, _, _ = post_json(server.url, route, {**payload, "model": "tiny-r4-qv"}, team)
        assert status == 200
    status, _, body = call(server.url, "GET", "/tokenizer_info", headers=team)
    assert (status, body["error"]["param"]) == (404, "model")
    status, _, info = call(server.url, "GET", "/tokenizer_info?model=tiny-r4-qv", headers=team)
    assert status == 200 and info["vocab_size"] == engine.spec.vocab_size
    for key in (KEY, EVERY_MODEL_USER.secret):  # keys that may use the base still reach it
        assert call(server.url, "GET", "/tokenizer_info", headers=auth(key))[0] == 200
        assert post_json(server.url, "/tokenize", {"prompt": "Hello"}, auth(key))[0] == 200


def test_keys_on_the_command_line_warn_and_point_to_the_keys_file(caplog, capsys):
    with caplog.at_level(logging.WARNING):
        assert main([*BASE_FLAGS, "--api-key", KEY]) == 1
    warned = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert any("process list (ps); use --keys-file" in message for message in warned), warned
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    assert "prefer --keys-file" in " ".join(capsys.readouterr().out.split())
