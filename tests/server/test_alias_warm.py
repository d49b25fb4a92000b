"""Warm on first use of an alias: the library's aliases are served as other names of their
adapters; the first request by an alias (since its engine started) reads the adapters listed for
the alias into host RAM in the background, and only those; the list is set on the command line,
kept in the library (with the audit log) and goes with its alias."""

from __future__ import annotations

import json
import urllib.request

import pytest

from multilora_studio.adapters.library_errors import LibraryError
from multilora_studio.cli import main
from multilora_studio.deploy.model_aliases import ModelAliases
from multilora_studio.server import ApiServer, ServerConfig
from tests.library_fixtures import home_library, served
from tests.server_fixtures import GREEDY, client
from tests.waiting import wait_until

LISTED = ("alias-warm-a", "alias-warm-b")


@pytest.fixture
def library(monkeypatch, tmp_path, tiny_adapters, tiny_base):
    folders = {
        "alias-main": tiny_adapters["tiny-r4-qv"],
        "alias-warm-a": tiny_adapters["tiny-r8-all"],
        "alias-warm-b": tiny_adapters["tiny-r16-mlp"],
        "alias-other": tiny_adapters["tiny-r8-attn"],
    }
    return home_library(monkeypatch, tmp_path, tiny_base, folders, aliases={"alias-main": ["support"]})


def test_the_first_request_by_an_alias_reads_its_warm_list(library, engine):
    record = library.set_alias_warm("support", [*LISTED, "alias-warm-a"])  # a repeat is listed once
    assert record.name == "alias-main" and record.alias_warm == (("support", LISTED),)
    with served(engine) as (pool, added):
        server = ApiServer(pool, ServerConfig(port=0))
        server.start()
        try:
            assert sorted(added) == sorted(["alias-main", "alias-other", *LISTED])
            held = engine.metrics(fresh=True).cpu_adapters
            assert not set(LISTED) & set(held)  # nothing read before the alias is used

            by_alias = client(server).completions.create(model="support", prompt="hi", max_tokens=6, **GREEDY)
            wait_until(
                lambda: set(LISTED) <= set(engine.metrics(fresh=True).cpu_adapters),
                what="the alias's warm list in host RAM",
            )
            assert "alias-other" not in engine.metrics(fresh=True).cpu_adapters  # not listed: not read
            by_name = client(server).completions.create(
                model="alias-main", prompt="hi", max_tokens=6, **GREEDY
            )
            base = client(server).completions.create(
                model=engine.model_name, prompt="hi", max_tokens=6, **GREEDY
            )
            assert by_alias.choices[0].text == by_name.choices[0].text != base.choices[0].text
            assert pool.warm_alias("support", engine) is None  # used on this engine already

            with urllib.request.urlopen(f"{server.url}/v1/usage", timeout=30) as reply:
                rows = {row["model"]: row for row in json.loads(reply.read())["data"]}
            assert rows["support"]["requests"] == 1  # counted under the name it was asked by
        finally:
            server.stop()


class Started:
    """An engine as the alias bookkeeping sees it: only its identity counts."""


def test_an_alias_warms_again_on_each_engine_it_is_first_used_on():
    aliases = ModelAliases()
    aliases.set("support", "main", warm=("a", "b"))
    first, restarted = Started(), Started()  # two engines of the alias's base, one after the other
    assert aliases.first_use("support", first) == ("a", "b")
    assert aliases.first_use("support", first) == ()
    assert aliases.first_use("support", restarted) == ("a", "b")
    assert aliases.first_use("other", first) == () and aliases.target("other") is None


def test_the_warm_list_is_set_shown_and_cleared_on_the_command_line(library, capsys):
    assert main(["adapters", "warm-on-alias", "support", "alias-warm-b", "alias-warm-a"]) == 0
    assert capsys.readouterr().out.strip() == "support (alias-main): alias-warm-b, alias-warm-a"
    assert main(["adapters", "warm-on-alias", "support"]) == 0
    assert capsys.readouterr().out.strip() == "support (alias-main): alias-warm-b, alias-warm-a"
    assert main(["adapters", "warm-on-alias", "support", "missing"]) == 1
    assert "no adapter named 'missing' in the library; nothing changed" in capsys.readouterr().err
    assert library.get("support").alias_warm == (("support", ("alias-warm-b", "alias-warm-a")),)
    assert main(["adapters", "warm-on-alias", "alias-main", "alias-warm-a"]) == 1  # a name, not an alias
    assert "no alias 'alias-main' in the library" in capsys.readouterr().err
    assert main(["adapters", "warm-on-alias", "support", "--clear"]) == 0
    assert capsys.readouterr().out.strip() == "support (alias-main): reads nothing on first use"
    events = [(e.event, e.reason) for e in library.events("alias-main")]
    assert events[-2:] == [
        ("warm on alias", "support: alias-warm-b, alias-warm-a"),
        ("warm on alias", "support: none"),
    ]


def test_the_warm_list_goes_with_its_alias_and_follows_renames(library):
    library.set_alias_warm("support", ["alias-warm-a"])
    library.rename("alias-warm-a", "alias-warm-renamed")
    assert library.get("alias-main").alias_warm == (("support", ("alias-warm-renamed",)),)
    library.remove("alias-warm-renamed")  # a removed adapter leaves the list
    assert library.get("alias-main").alias_warm == ()
    library.set_alias_warm("support", ["alias-warm-b"])
    library.remove_alias("support")
    library.add_alias("alias-main", "support")
    assert library.get("alias-main").alias_warm == ()  # a new alias of the same name starts empty
    with pytest.raises(LibraryError, match="no alias 'nobody'"):
        library.set_alias_warm("nobody", ["alias-warm-b"])
