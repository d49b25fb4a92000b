"""The test Hub's search answers as the Hub does: its fields, its order, its filters and limit."""

from __future__ import annotations

import pytest

from tests.adapters.hub_listing import DEFAULT_FIELDS, BadQuery, all_models, search
from tests.adapters.hub_repos import LocalRepos, model_card

BASE = "studio-tests/tiny-llama"
SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOL_ADAPTERS_BY_DOWNLOADS = [  # from hub_listing.json, by hand
    "acme-research/smollm2-135m-summarize-lora",  # 15873
    "jdoe-ml/smollm2-135m-sql-lora",  # 8412
    "acme-research/smollm2-135m-instruct-pirate-lora",  # 912
    "lunalab/SmolLM2-135M-Instruct-dpo-lora",  # 40
]


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_adapters) -> list[dict]:
    repos = LocalRepos(tmp_path_factory.mktemp("listing") / "mirrors")
    made = (("tiny-lora", "tiny-r4-qv"), ("tiny-saved-head", "tiny-r8-all"), ("unrecorded", "tiny-r8-all"))
    for name, adapter in made:
        repos.add_adapter(f"studio-tests/{name}", "v1", tiny_adapters[adapter], BASE)
    repos.commit(BASE, "v1", {"README.md": model_card(None, library="transformers")})
    return all_models([repos.mirrors])


def ids(found: list[dict]) -> list[str]:
    return [model["id"] for model in found]


def test_a_local_repository_is_listed_with_its_recorded_counts_and_its_own_commit(models):
    (lora,) = search(models, search="tiny-lora", full=True)
    assert (lora["downloads"], lora["likes"], lora["createdAt"]) == (1523, 12, "2025-03-11T09:42:17.000Z")
    assert lora["author"] == "studio-tests" and len(lora["sha"]) == 40
    assert lora["tags"] == [
        "peft",
        "safetensors",
        "lora",
        "base_model:studio-tests/tiny-llama",
        "base_model:adapter:studio-tests/tiny-llama",
        "region:us",
    ]
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md"} <= {
        s["rfilename"] for s in lora["siblings"]
    }
    (unrecorded,) = search(models, search="unrecorded", full=True)
    assert (unrecorded["downloads"], unrecorded["likes"]) == (0, 0)
    # recorded repositories the test Hub does not hold here are not listed
    assert "studio-tests/tiny-r8-all" not in ids(search(models))


def test_sort_by_downloads_likes_and_creation(models):
    adapters = {"filters": [f"base_model:adapter:{SMOL}"]}
    assert ids(search(models, sort="downloads", **adapters)) == SMOL_ADAPTERS_BY_DOWNLOADS
    assert ids(search(models, sort="likes", **adapters)) == [
        "acme-research/smollm2-135m-instruct-pirate-lora",  # 57
        "acme-research/smollm2-135m-summarize-lora",  # 44
        "jdoe-ml/smollm2-135m-sql-lora",  # 23
        "lunalab/SmolLM2-135M-Instruct-dpo-lora",  # 1
    ]
    newest_first = ids(search(models, sort="createdAt", **adapters))
    assert newest_first[0] == "lunalab/SmolLM2-135M-Instruct-dpo-lora"
    assert ids(search(models, sort="createdAt", direction="1", **adapters)) == newest_first[::-1]
    # downloads sort descending only, whatever the direction
    assert ids(search(models, sort="downloads", direction="1", **adapters)) == SMOL_ADAPTERS_BY_DOWNLOADS
    by_trend = search(models, **adapters, expand=["trendingScore"])
    assert [m["trendingScore"] for m in by_trend] == [12, 9, 6, 0]  # trending first without a sort
    with pytest.raises(BadQuery, match="Invalid sort parameter"):
        search(models, sort="download")


def test_limit_filter_author_and_search_narrow_the_answer(models):
    assert (
        ids(search(models, sort="downloads", limit="2", filters=[f"base_model:{SMOL}"]))
        == (SMOL_ADAPTERS_BY_DOWNLOADS[:2])
    )
    assert ids(search(models, author="acme-research", sort="downloads")) == [
        SMOL_ADAPTERS_BY_DOWNLOADS[0],
        SMOL_ADAPTERS_BY_DOWNLOADS[2],
    ]
    assert ids(search(models, search="SQL")) == ["jdoe-ml/smollm2-135m-sql-lora"]  # case-insensitive
    assert ids(search(models, filters=[f"base_model:adapter:{SMOL}", "trl"])) == [
        "lunalab/SmolLM2-135M-Instruct-dpo-lora"  # every filter must match
    ]
    assert search(models, filters=["no-such-tag"]) == []
    assert search(models, limit="0") == []
    with pytest.raises(BadQuery, match="limit"):
        search(models, limit="many")


def test_fields_are_the_hubs_defaults_unless_full_or_expanded(models):
    plain = search(models, search="tiny-lora")[0]
    assert set(plain) == set(DEFAULT_FIELDS)
    assert "sha" not in plain and "lastModified" not in plain and "author" not in plain
    assert set(search(models, search="tiny-lora", expand=["downloads", "sha"])[0]) == {
        "_id",
        "id",
        "downloads",
        "sha",
    }
    full = search(models, search="sql", full=True)[0]
    assert {"author", "sha", "lastModified", "siblings", "gated"} <= set(full)
