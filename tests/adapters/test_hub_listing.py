"""The test Hub's search answers as the Hub does: its fields, its order, its filters and limit."""

from __future__ import annotations

import pytest

from tests.adapters.hub_listing import DEFAULT_FIELDS, BadQuery, all_models, search
from tests.adapters.hub_repos import LocalRepos, model_card

BASE = "studio-tests/tiny-llama"
# The text-generation records of hub_records/recorded.json by downloads, copied from the records by hand
TEXT_GENERATION_BY_DOWNLOADS = [
    "openai-community/gpt2",  # 17272637
    "meta-llama/Llama-3.1-8B-Instruct",  # 5795728
    "meta-llama/Meta-Llama-3-8B-Instruct",  # 1127302
    "HuggingFaceH4/zephyr-7b-beta",  # 684157
    "meta-llama/Meta-Llama-3-70B-Instruct",  # 368577
    "microsoft/DialoGPT-small",  # 197493
    "HuggingFaceH4/zephyr-orpo-141b-A35b-v0.1",  # 200
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


def test_a_local_repository_is_listed_with_its_counts_and_its_own_commit(models):
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
    # counts of test repositories the test Hub does not hold here list nothing
    assert "studio-tests/tiny-r8-all" not in ids(search(models))


def test_recorded_records_are_listed_with_their_real_fields(models):
    (gpt2,) = search(models, search="openai-community/gpt2", full=True)
    assert gpt2["sha"] == "607a30d783dfa663caf39e06633721c8d4cfcd7e"
    assert (gpt2["downloads"], gpt2["likes"], gpt2["author"]) == (17272637, 2630, "openai-community")
    assert {"config.json", "model.safetensors"} <= {s["rfilename"] for s in gpt2["siblings"]}
    (llama,) = search(models, search="Llama-3.1-8B", full=True)
    assert llama["gated"] == "manual" and "base_model:finetune:meta-llama/Llama-3.1-8B" in llama["tags"]


def test_sort_by_downloads_likes_creation_and_modification(models):
    text_generation = ["text-generation"]
    assert ids(search(models, sort="downloads", filters=text_generation)) == TEXT_GENERATION_BY_DOWNLOADS
    assert ids(search(models, sort="likes", filters=text_generation)) == [
        "meta-llama/Meta-Llama-3-8B-Instruct",  # 3874
        "meta-llama/Llama-3.1-8B-Instruct",  # 3763
        "openai-community/gpt2",  # 2630
        "HuggingFaceH4/zephyr-7b-beta",  # 1667
        "meta-llama/Meta-Llama-3-70B-Instruct",  # 1464
        "HuggingFaceH4/zephyr-orpo-141b-A35b-v0.1",  # 266
        "microsoft/DialoGPT-small",  # 121
    ]
    newest_first = [
        "meta-llama/Llama-3.1-8B-Instruct",  # 2024-07-18T08:56:00
        "meta-llama/Meta-Llama-3-8B-Instruct",  # 2024-04-17T09:35:12
        "meta-llama/Meta-Llama-3-70B-Instruct",  # 2024-04-17T09:34:54
        "HuggingFaceH4/zephyr-orpo-141b-A35b-v0.1",  # 2024-04-10
        "HuggingFaceH4/zephyr-7b-beta",  # 2023-10-26
        "microsoft/DialoGPT-small",  # 2022-03-02T23:29:05
        "openai-community/gpt2",  # 2022-03-02T23:29:04
    ]
    assert ids(search(models, sort="createdAt", filters=text_generation)) == newest_first
    assert ids(search(models, sort="createdAt", direction="1", filters=text_generation)) == newest_first[::-1]
    assert ids(search(models, sort="lastModified", limit="3", filters=text_generation)) == [
        "meta-llama/Meta-Llama-3-70B-Instruct",  # 2024-12-15
        "HuggingFaceH4/zephyr-7b-beta",  # 2024-10-16
        "meta-llama/Meta-Llama-3-8B-Instruct",  # 2024-09-27
    ]
    # downloads sort descending only, whatever the direction
    by_downloads = ids(search(models, sort="downloads", direction="1", filters=text_generation))
    assert by_downloads == TEXT_GENERATION_BY_DOWNLOADS
    with pytest.raises(BadQuery, match="Invalid sort parameter"):
        search(models, sort="download")


def test_without_a_sort_trending_comes_first(models):
    found = search(models, expand=["trendingScore"])
    assert ids(found)[:2] == [BASE, "studio-tests/tiny-saved-head"]  # 41, 5 (test_repos.json)
    scores = [m.get("trendingScore", 0) for m in found]
    assert scores == sorted(scores, reverse=True)
    assert "openai-community/gpt2" in ids(found)  # recorded model pages carry no trendingScore


def test_limit_filter_author_and_search_narrow_the_answer(models):
    assert (
        ids(search(models, sort="downloads", limit="2", filters=["text-generation"]))
        == (TEXT_GENERATION_BY_DOWNLOADS[:2])
    )
    assert ids(search(models, author="meta-llama", sort="downloads")) == [
        "meta-llama/Llama-3.1-8B-Instruct",
        "meta-llama/Meta-Llama-3-8B-Instruct",
        "meta-llama/Meta-Llama-3-70B-Instruct",
    ]
    zephyr = "HuggingFaceH4/zephyr-7b-beta"
    assert ids(search(models, author="HuggingFaceH4", sort="downloads", limit="1")) == [zephyr]
    # search: a case-insensitive substring of the id
    assert ids(search(models, search="META-LLAMA-3", sort="likes")) == [
        "meta-llama/Meta-Llama-3-8B-Instruct",
        "meta-llama/Meta-Llama-3-70B-Instruct",
    ]
    finetunes = "base_model:finetune:mistralai/Mistral-7B-v0.1"
    assert ids(search(models, filters=["text-generation", finetunes])) == [zephyr]  # every filter must match
    assert ids(search(models, filters=[f"base_model:adapter:{BASE}"], sort="downloads")) == [
        "studio-tests/tiny-saved-head",  # 7760
        "studio-tests/tiny-lora",  # 1523
        "studio-tests/unrecorded",  # 0
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
    recorded = search(models, search="DialoGPT")[0]
    assert set(recorded) == set(DEFAULT_FIELDS) - {"trendingScore"}
    full = search(models, search="DialoGPT", full=True)[0]
    assert {"author", "sha", "lastModified", "siblings", "gated"} <= set(full)
