"""vLLM's /tokenize and /detokenize, GET /tokenizer_info, and lm-evaluation-harness's probe of them."""

from __future__ import annotations

from lm_eval.utils import RemoteTokenizer, check_remote_tokenizer_support

from tests.server_fixtures import GREEDY, client
from tests.server.raw_http import call, post_json

KEY = "sk-tokenize-test-1"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = [{"role": "user", "content": "Tell me about the sea."}]
IMAGE = [{"role": "user", "content": [{"type": "image"}]}]


def test_tokenize_and_detokenize_round_trip_as_the_engine_encodes(serve, engine):
    server = serve()
    status, _, body = post_json(server.url, "/tokenize", {"prompt": "Once upon a time"})
    assert status == 200, body
    assert body["tokens"] == engine.encode("Once upon a time")
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == engine.config.max_model_len
    assert body["token_strs"] is None
    status, _, back = post_json(server.url, "/detokenize", {"model": "tiny-r4-qv", "tokens": body["tokens"]})
    assert status == 200 and back == {"prompt": "Once upon a time"}
    status, _, chat = post_json(server.url, "/tokenize", {"model": engine.model_name, "messages": CHAT})
    assert status == 200 and chat["tokens"] == engine.encode(CHAT)
    plain = {"prompt": "Hi there", "add_special_tokens": False, "return_token_strs": True}
    status, _, named = post_json(server.url, "/tokenize", plain)
    assert status == 200 and "".join(named["token_strs"]) == "Hi there"
    assert named["tokens"] == list(engine.tokenizer("Hi there", add_special_tokens=False).input_ids)


def test_tokenizer_info_names_the_special_tokens_and_template(serve, engine):
    status, _, info = call(serve().url, "GET", "/tokenizer_info")
    assert status == 200
    tokenizer = engine.tokenizer
    assert info["eos_token"] == str(tokenizer.eos_token)
    assert info["bos_token"] == (None if tokenizer.bos_token is None else str(tokenizer.bos_token))
    assert info["pad_token"] == (None if tokenizer.pad_token is None else str(tokenizer.pad_token))
    assert info["chat_template"] == tokenizer.chat_template
    assert info["model_max_length"] == engine.config.max_model_len


def test_bad_tokenize_requests_are_openai_errors(serve):
    server = serve()
    cases = [
        ("/tokenize", {"model": "no-such-adapter", "prompt": "Hi"}, 404, "model"),
        ("/tokenize", {"prompt": "Hi", "messages": CHAT}, 400, "prompt"),
        ("/tokenize", {}, 400, "prompt"),
        ("/tokenize", {"messages": IMAGE}, 400, "messages.0.content"),
        ("/detokenize", {"tokens": [1, 10**9]}, 400, "tokens"),
        ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
    ]
    for path, payload, status, param in cases:
        got, _, body = post_json(server.url, path, payload)
        assert got == status and body["error"]["param"] == param, (payload, body)


def test_keys_and_per_key_limits_apply_to_the_tokenizer_routes(serve):
    server = serve(api_keys=(KEY,), max_concurrent_per_key=1)
    for method, path, payload in (
        ("GET", "/tokenizer_info", None),
        ("POST", "/tokenize", {"prompt": "Hi"}),
        ("POST", "/detokenize", {"tokens": [1]}),
    ):
        if payload is None:
            status, _, body = call(server.url, method, path)
        else:
            status, _, body = post_json(server.url, path, payload)
        assert status == 401 and body["error"]["code"] == "invalid_api_key", path
    status, _, body = post_json(server.url, "/tokenize", {"prompt": "Hi"}, AUTH)
    assert status == 200 and body["count"] >= 1
    status, _, _ = call(server.url, "GET", "/tokenizer_info", headers={"Host": "evil.example"} | AUTH)
    assert status == 403
    stream = client(server, api_key=KEY).completions.create(
        model="tiny-r4-qv", prompt="Hi", stream=True, max_tokens=1000, **GREEDY
    )
    next(iter(stream))  # the key's one open request
    status, _, body = post_json(server.url, "/tokenize", {"prompt": "Hi"}, AUTH)
    assert status == 429 and body["error"]["code"] == "concurrency_limit_exceeded"
    stream.close()


def test_lm_eval_detects_and_uses_the_remote_tokenizer(serve, engine):
    server = serve()
    assert check_remote_tokenizer_support(f"{server.url}/v1/completions")
    remote = RemoteTokenizer(f"{server.url}/v1/completions")
    text = "The quick brown fox"
    assert remote.encode(text) == list(engine.tokenizer(text, add_special_tokens=False).input_ids)
    assert remote.decode(remote.encode(text)) == text
    assert remote.eos_token_id == engine.tokenizer.eos_token_id
