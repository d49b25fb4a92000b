"""Key scopes on a real server: admin keys run everything, user keys only generate, for their models."""

from __future__ import annotations

import json
import os

import openai
import pytest

from multilora_studio.cli import main
from multilora_studio.engine import SamplingParams
from multilora_studio.server.api_keys import USER, ApiKey, read_keys_file
from tests.server.raw_http import call, post_json
from tests.server_fixtures import GREEDY, client

ADMIN_KEY = "sk-admin-key-00001"
TEAM_A = ApiKey("sk-team-a-key-0001", USER, ("tiny-r4-*", "tiny-r8-qo"), "team-a")
EVERY_MODEL_USER = ApiKey("sk-any-model-user1", USER)


@pytest.fixture
def scoped(serve):
    return serve(api_keys=(ADMIN_KEY, TEAM_A, EVERY_MODEL_USER))


def greedy_text(engine, prompt: str, adapter: str, max_tokens: int) -> str:
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    return engine.generate([prompt], [adapter], params)[0].text


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_a_user_key_generates_with_its_own_models_only(scoped, engine):
    team = client(scoped, api_key=TEAM_A.secret)
    for model in ("tiny-r4-qv", "tiny-r4-down", "tiny-r8-qo"):
        made = team.completions.create(model=model, prompt="Hello", max_tokens=4, **GREEDY)
        assert made.choices[0].text == greedy_text(engine, "Hello", model, 4)
    for model in ("tiny-r8-all", engine.model_name):
        with pytest.raises(openai.NotFoundError) as refused:
            team.completions.create(model=model, prompt="Hello", max_tokens=4)
        # the same answer as for a model that does not exist: other tenants' names stay hidden
        body = refused.value.body
        assert (body["code"], body["param"]) == ("model_not_found", "model") and model in body["message"]
    assert [record.api_key for record in scoped.request_log.records()][-5:] == ["team-a"] * 5


def test_a_user_key_lists_and_reads_only_its_models(scoped, engine):
    listed = sorted(card.id for card in client(scoped, api_key=TEAM_A.secret).models.list().data)
    assert listed == ["tiny-r4-down", "tiny-r4-qv", "tiny-r8-qo"]
    assert call(scoped.url, "GET", "/v1/models/tiny-r8-all", headers=auth(TEAM_A.secret))[0] == 404
    everything = client(scoped, api_key=EVERY_MODEL_USER.secret).models.list().data
    assert len(everything) == len(engine.list_adapters()) + 1


def test_a_user_key_cannot_load_unload_or_read_metrics(scoped, engine, server_adapters):
    for key in (TEAM_A.secret, EVERY_MODEL_USER.secret):
        load = {"lora_name": "tiny-r4-qv-again", "lora_path": str(server_adapters["tiny-r4-qv"])}
        status, _, body = post_json(scoped.url, "/v1/load_lora_adapter", load, auth(key))
        assert status == 403 and body["error"]["code"] == "permission_denied"
        assert "need an admin key" in body["error"]["message"]  # says what would be allowed
        status, _, body = post_json(
            scoped.url, "/v1/unload_lora_adapter", {"lora_name": "tiny-r4-qv"}, auth(key)
        )
        assert status == 403 and body["error"]["code"] == "permission_denied"
        assert call(scoped.url, "GET", "/metrics", headers=auth(key))[0] == 403
    assert "tiny-r4-qv" in {info.name for info in engine.list_adapters()}
    assert "tiny-r4-qv-again" not in {info.name for info in engine.list_adapters()}
    assert call(scoped.url, "GET", "/metrics", headers=auth(ADMIN_KEY))[0] == 200


def test_an_admin_key_loads_and_unloads(scoped, engine, server_adapters):
    load = {"lora_name": "tiny-r4-qv-copy", "lora_path": str(server_adapters["tiny-r4-qv"])}
    assert post_json(scoped.url, "/v1/load_lora_adapter", load, auth(ADMIN_KEY))[0] == 200
    try:
        # a pattern of a user key covers a newly loaded adapter at once
        team = client(scoped, api_key=TEAM_A.secret)
        made = team.completions.create(model="tiny-r4-qv-copy", prompt="Hi", max_tokens=3, **GREEDY)
        assert made.choices[0].text == greedy_text(engine, "Hi", "tiny-r4-qv", 3)
    finally:
        unload = {"lora_name": "tiny-r4-qv-copy"}
        assert post_json(scoped.url, "/v1/unload_lora_adapter", unload, auth(ADMIN_KEY))[0] == 200


def test_tokenize_obeys_the_models_of_the_key(scoped):
    body = {"model": "tiny-r8-all", "prompt": "Hello"}
    assert post_json(scoped.url, "/tokenize", body, auth(TEAM_A.secret))[0] == 404
    assert post_json(scoped.url, "/tokenize", body | {"model": "tiny-r4-qv"}, auth(TEAM_A.secret))[0] == 200


def test_per_key_limits_follow_the_key_names(serve):
    server = serve(api_keys=(TEAM_A, EVERY_MODEL_USER), tokens_per_minute_per_key=12)
    team = client(server, api_key=TEAM_A.secret)
    team.completions.create(model="tiny-r4-qv", prompt="Hi", max_tokens=8, **GREEDY)
    with pytest.raises(openai.RateLimitError):
        team.completions.create(model="tiny-r4-qv", prompt="Hi", max_tokens=8, **GREEDY)
    other = client(server, api_key=EVERY_MODEL_USER.secret)
    assert other.completions.create(model="tiny-r4-qv", prompt="Hi", max_tokens=2, **GREEDY).choices


def write_keys(tmp_path, entries, mode=0o600):
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(entries))
    os.chmod(path, mode)
    return path


def test_a_keys_file_gives_roles_models_names_and_secrets_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TEAM_B_KEY", "sk-team-b-from-env")
    path = write_keys(
        tmp_path,
        [
            {"key": "sk-ops-admin-0001", "role": "admin", "name": "ops"},
            {"key_env": "TEAM_B_KEY", "models": ["team-b-*"], "name": "team-b"},
        ],
    )
    ops, team_b = read_keys_file(path)
    assert (ops.role, ops.name, ops.models) == ("admin", "ops", None)
    assert (team_b.secret, team_b.role, team_b.models) == ("sk-team-b-from-env", USER, ("team-b-*",))
    assert team_b.may_use("team-b-sql") and not team_b.may_use("team-a-sql")


@pytest.mark.parametrize(
    ("entries", "mode", "message"),
    [
        ([{"key": "sk-fine-key-0001"}], 0o644, "can be read by other users: chmod 600"),
        ([{"key": "sk-fine-key-0001", "scope": "all"}], 0o600, "unknown fields ['scope']"),
        ([{"key_env": "NO_SUCH_VARIABLE_SET"}], 0o600, "$NO_SUCH_VARIABLE_SET is not set or empty"),
        ([{"key": "short"}], 0o600, "at least 8 characters"),
        ([{"key": "sk-fine-key-0001", "role": "root"}], 0o600, "role must be one of admin, user"),
        ([{"key": "sk-fine-key-0001", "role": "admin", "models": ["a"]}], 0o600, "admin key may use every"),
        ([], 0o600, "non-empty JSON list"),
    ],
)
def test_a_bad_keys_file_stops_serve_with_one_line(tmp_path, capsys, entries, mode, message):
    path = write_keys(tmp_path, entries, mode)
    assert main(["serve", "--model", "/no/such/model", "--port", "0", "--keys-file", str(path)]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and "/no/such/model" not in err


def test_duplicate_keys_and_names_are_refused(serve):
    with pytest.raises(ValueError, match="the same API key is given twice"):
        serve(api_keys=(ADMIN_KEY, ApiKey(ADMIN_KEY, USER)))
    with pytest.raises(ValueError, match="two API keys have the same name"):
        serve(api_keys=(TEAM_A, ApiKey("sk-another-secret-1", USER, None, "team-a")))
