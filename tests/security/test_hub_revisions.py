"""Hub revisions are commit hashes or git ref names: ``@../x`` and the like are refused before the
Hub is asked, from the command line and from a request's ``model``, and nothing is written
outside the HF cache."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest

from multilora_studio.adapters.hub import HubError, HubSettings, Snapshot, fetch, parse_repo_ref
from multilora_studio.cli import main
from tests.adapter_fixtures import HUB_ORG
from tests.security.slow_relay import SlowRelay
from tests.server.raw_http import post_json

LORA = f"{HUB_ORG}/tiny-lora"
ESCAPES = [
    "../../../../escape",
    "main/../../../escape",
    "a//b",
    "x.lock",
    "@{-1}",
    "bad name",
    ".hidden",
    "v1.",
]


def files_under(root: Path) -> set[Path]:
    return {path for path in root.rglob("*") if path.is_file()}


@pytest.fixture
def counted_hub(hub, hub_env, monkeypatch):
    """The test Hub behind a relay that counts the connections made to it."""
    relay = SlowRelay(urlsplit(hub.endpoint).port, hold_s=0)
    monkeypatch.setenv("HF_ENDPOINT", relay.endpoint)
    yield relay
    relay.close()


@pytest.mark.parametrize("revision", ESCAPES)
def test_the_pull_command_refuses_a_revision_git_would_refuse(
    revision, counted_hub, hub_env, tiny_model_dir, tmp_path, capsys
):
    code = main(["pull", f"{LORA}@{revision}", "--model", str(tiny_model_dir)])
    err = capsys.readouterr().err
    assert code != 0 and "does not name a Hub revision" in err and revision in err
    assert counted_hub.connections == 0  # refused before the Hub was asked
    assert not hub_env.cache_dir.exists() or files_under(hub_env.cache_dir) == set()
    assert not list(tmp_path.parent.rglob("escape"))


def test_a_requests_model_with_such_a_revision_is_a_404_and_asks_nothing(counted_hub, serve, registry):
    server = serve(registry=registry, allow_hub_adapters=True)
    status, _, body = post_json(
        server.url,
        "/v1/completions",
        {"model": f"{LORA}@../../../../escape", "prompt": "Hi", "max_tokens": 1},
    )
    assert (status, body["error"]["param"]) == (404, "model")
    assert server.state.hub is not None and server.state.hub.pulls_started == 0
    assert counted_hub.connections == 0


def test_commit_hashes_branches_tags_and_pr_refs_are_revisions():
    sha = "0123456789abcdef0123456789abcdef01234567"
    for revision in (sha, "main", "v1.0", "refs/pr/1", "release/2024-05", "feature_x-y"):
        assert parse_repo_ref(f"{LORA}@{revision}") == (LORA, revision)
    for revision in ESCAPES:
        with pytest.raises(HubError, match="does not name a Hub revision"):
            parse_repo_ref(f"{LORA}@{revision}")


def test_a_revision_name_is_never_written_outside_the_cache(hub_env, tmp_path):
    """The cache's ``refs/<name>`` record refuses a name that leaves ``refs`` whatever asked for it
    (a Snapshot made by hand, an endpoint that answered such a revision)."""
    settings = HubSettings(hub_env.endpoint, tmp_path / "outside" / "cache", offline=False)
    snapshot = Snapshot(LORA, "0123456789abcdef0123456789abcdef01234567", "../../../escape", {})
    with pytest.raises(HubError, match="not a revision name the HF cache can record"):
        fetch(snapshot, [], settings)
    assert not (tmp_path / "outside" / "escape").exists()
    assert files_under(tmp_path) == set()
