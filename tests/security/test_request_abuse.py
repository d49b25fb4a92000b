"""Odd values in request fields: each is a 400 naming the field; nothing answers with server internals."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.server.raw_http import call, post_json

MODEL = "tiny-r4-qv"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
COMPLETION = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}

# (route, body changes, the field the 400 must name)
REFUSED = [
    ("/v1/chat/completions", {"logprobs": 0}, "logprobs"),
    ("/v1/chat/completions", {"logprobs": 1}, "logprobs"),
    ("/v1/chat/completions", {"stop": ""}, "stop"),
    ("/v1/completions", {"ignore_eos": "yes"}, "ignore_eos"),
    ("/v1/chat/completions", {"ignore_eos": 1}, "ignore_eos"),
    ("/v1/completions", {"max_tokens": True}, "max_tokens"),
    ("/v1/chat/completions", {"max_tokens": True}, "max_tokens"),
    ("/v1/chat/completions", {"max_completion_tokens": "4"}, "max_completion_tokens"),
    ("/v1/completions", {"n": True}, "n"),
    ("/v1/completions", {"logprobs": True}, "logprobs"),
    ("/v1/completions", {"temperature": True}, "temperature"),
    ("/v1/completions", {"seed": "7"}, "seed"),
    ("/v1/completions", {"echo": "true"}, "echo"),
    ("/v1/completions", {"stream": 1}, "stream"),
    ("/v1/completions", {"prompt": [True, False]}, "prompt"),
    ("/v1/completions", {"stream_options": {"include_usage": True}}, "stream_options"),
    ("/v1/chat/completions", {"stream_options": {"include_usage": True}}, "stream_options"),
    ("/v1/chat/completions", {"stream": False, "stream_options": {}}, "stream_options"),
    ("/v1/responses", {"max_output_tokens": True}, "max_output_tokens"),
]


def _body(route: str, changes: dict) -> dict:
    if route == "/v1/responses":
        return {"model": MODEL, "input": "Hi", "max_output_tokens": 2, **changes}
    base = CHAT if route == "/v1/chat/completions" else COMPLETION
    return {**base, **changes}


@pytest.mark.parametrize(("route", "changes", "field"), REFUSED, ids=[f"{r[2]}={r[1]}" for r in REFUSED])
def test_values_the_docs_refuse_are_a_400_naming_the_field(serve, route, changes, field):
    server = serve()
    status, _, body = post_json(server.url, route, _body(route, changes))
    assert status == 400, body
    assert body["error"]["param"].split(".")[0] == field


LONE_SURROGATE = b'"Hi \\ud800 there"'
SURROGATE_BODIES = [
    (
        "/v1/chat/completions",
        b'{"model": "%s", "max_tokens": 2, "messages": [{"role": "user", "content": %s}]}',
    ),
    ("/v1/completions", b'{"model": "%s", "max_tokens": 2, "prompt": %s}'),
    ("/v1/responses", b'{"model": "%s", "max_output_tokens": 2, "input": %s}'),
    ("/tokenize", b'{"model": "%s", "prompt": %s}'),
    ("/v1/completions", b'{"model": "%s", "max_tokens": 2, "prompt": "Hi", "stop": [%s]}'),
]


@pytest.mark.parametrize(("route", "template"), SURROGATE_BODIES)
def test_a_lone_surrogate_is_a_400_saying_not_valid_unicode(serve, route, template):
    server = serve()
    payload = template % (MODEL.encode(), LONE_SURROGATE)
    status, _, body = call(server.url, "POST", route, payload, {"Content-Type": "application/json"})
    assert status == 400, body
    message = body["error"]["message"]
    assert "is not valid Unicode" in message
    assert body["error"]["param"] in message
    for internal in ("TextEncodeInput", "surrogates not allowed", "Traceback", "utf-8"):
        assert internal not in message


def test_model_list_shows_names_not_server_paths(serve, engine, server_adapters, tiny_model_dir):
    server = serve()
    status, _, body = call(server.url, "GET", "/v1/models")
    assert status == 200
    text = str(body)
    for folder in [tiny_model_dir, *server_adapters.values()]:
        assert str(folder) not in text
    cards = {card["id"]: card for card in body["data"]}
    assert cards[MODEL]["root"] == MODEL and cards[MODEL]["parent"] == engine.model_name
    status, _, card = call(server.url, "GET", f"/v1/models/{MODEL}")
    assert status == 200 and card["root"] == MODEL


def _load_error(server, path: str) -> tuple[int, str]:
    status, _, body = post_json(
        server.url, "/v1/load_lora_adapter", {"lora_name": "probe", "lora_path": path}
    )
    return status, body["error"]["message"].replace(path, "PATH")


def test_load_errors_do_not_tell_which_paths_exist(serve, tmp_path: Path):
    server = serve()
    empty = tmp_path / "empty"
    empty.mkdir()
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    paths = (tmp_path / "missing", empty, a_file, tmp_path / "missing" / "deeper", Path("/etc"), Path("/"))
    answers = {_load_error(server, str(path)) for path in paths}
    assert len(answers) == 1, answers
    status, message = answers.pop()
    assert status == 400 and "no adapter at PATH" in message
