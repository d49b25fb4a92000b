"""Base models in the library, on a real SQLite file: a pulled base once per repository and
commit, a merged base under a name of its own, a base found by the digest of its weights."""

from __future__ import annotations

import json
import logging
import time

import pytest

from multilora_studio.adapters.registry import MERGED_REVISION, LibraryError, Registry

COMMIT_A, COMMIT_B = "a" * 40, "b" * 40


def fields(record) -> tuple:
    return (
        record.repo_id,
        record.revision,
        record.requested_revision,
        record.path,
        record.digest,
        record.origin,
    )


def test_a_pulled_base_is_recorded_once_per_repository_and_commit(registry, tmp_path):
    started = time.time()
    first = registry.register_base_model("org/base", COMMIT_A, "main", tmp_path / "snap-a", "digest-a")
    assert fields(first) == ("org/base", COMMIT_A, "main", tmp_path / "snap-a", "digest-a", "")
    assert started <= first.created <= time.time()
    # the same commit again (another branch name, another folder): the first record stands
    assert registry.register_base_model("org/base", COMMIT_A, None, tmp_path / "x", "digest-x") == first
    second = registry.register_base_model("org/base", COMMIT_B, None, tmp_path / "snap-b", "digest-b")
    other = registry.register_base_model("another/base", COMMIT_A, "v1", tmp_path / "other", "digest-o")
    assert len({first.id, second.id, other.id}) == 3
    assert fields(second) == ("org/base", COMMIT_B, None, tmp_path / "snap-b", "digest-b", "")
    assert registry.list_base_models() == [other, first, second]  # by repository, then by age
    assert Registry(registry.root).list_base_models() == [other, first, second]  # on the file


def test_a_base_is_found_by_the_digest_of_its_weights_the_newest_first(registry, tmp_path):
    registry.register_base_model("org/older", COMMIT_A, None, tmp_path / "older", "same")
    newer = registry.register_base_model("org/newer", COMMIT_A, None, tmp_path / "newer", "same")
    other = registry.register_base_model("org/other", COMMIT_A, None, tmp_path / "other", "another")
    registry.register_base_model("org/undigested", COMMIT_A, None, tmp_path / "undigested", "")
    assert registry.find_base_model("same") == newer
    assert registry.find_base_model("another") == other
    assert registry.find_base_model("missing") is None
    assert registry.find_base_model("") is None  # no digest matches a record without one


def test_a_merged_base_takes_a_name_of_its_own(registry, tmp_path, caplog):
    registry.check_base_name("blend")  # free
    origin = json.dumps({"adapters": ["pirate", "poet"], "weights": [0.5, 0.5]})
    with caplog.at_level(logging.INFO):
        merged = registry.register_merged_base("blend", tmp_path / "blend", "digest-m", origin)
    assert fields(merged) == ("blend", MERGED_REVISION, None, tmp_path / "blend", "digest-m", origin)
    assert f"registered merged base model 'blend' at {tmp_path / 'blend'}" in caplog.messages
    assert registry.find_base_model("digest-m") == merged
    message = f"a merged base model named 'blend' exists ({tmp_path / 'blend'}); choose another name"
    with pytest.raises(LibraryError) as checked:
        registry.check_base_name("blend")
    with pytest.raises(LibraryError) as registered:
        registry.register_merged_base("blend", tmp_path / "again", "digest-2", "{}")
    assert str(checked.value) == str(registered.value) == message
    assert registry.list_base_models() == [merged]  # nothing written by the refusal
    # a pulled repository of a name is not a merged base of that name
    registry.register_base_model("org/pulled", COMMIT_A, None, tmp_path / "pulled", "digest-p")
    registry.check_base_name("org/pulled")
    assert registry.register_merged_base("org/pulled", tmp_path / "m2", "digest-3", "{}").revision == "merged"
