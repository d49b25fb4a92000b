"""The library on a real SQLite file: records, names, transactions, leftovers, base digests."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sqlite3
import time

import pytest

from multilora_studio.adapters.library_sweep import writing
from multilora_studio.adapters.registry import (
    BaseMismatchError,
    LibraryError,
    Registry,
    check_record_base,
    serve_record,
)
from multilora_studio.adapters.registry_schema import SCHEMA_VERSION
from multilora_studio.cli.shared import describe_base
from tests.waiting import wait_until


def test_import_copies_the_folder_and_records_everything(registry, tiny_adapters, tiny_base):
    source = tiny_adapters["tiny-r8-attn"]
    started = time.time()
    record = registry.import_folder(source, tiny_base, notes="first try")
    assert record.name == "tiny-r8-attn"
    assert (record.source_kind, record.source, record.revision) == ("local", str(source.resolve()), None)
    assert record.path == registry.adapters_dir / record.id
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert (record.path / name).read_bytes() == (source / name).read_bytes()
    assert (record.rank, record.alpha) == (8, 32.0)
    assert record.targets == ("q_proj", "k_proj", "v_proj", "o_proj")
    assert record.size_bytes == (source / "adapter_model.safetensors").stat().st_size
    assert (record.base_name, record.base_digest) == (tiny_base.name, tiny_base.digest)
    assert record.declared_base is not None and record.declared_base.endswith(tiny_base.name)
    assert started <= record.created <= time.time()
    assert (record.last_used, record.pinned, record.notes) == (None, False, "first try")
    assert (record.tokens, record.tokenizer, record.kind) == (
        "",
        "",
        "LoRA",
    )  # plain LoRA, no files of its own
    assert Registry(registry.root).get("tiny-r8-attn") == record  # another instance reads the same file


def test_names_and_aliases_share_one_namespace(registry, tiny_adapters, tiny_base):
    first = registry.import_folder(tiny_adapters["tiny-r4-qv"], tiny_base, name="pirate", aliases=["arr"])
    assert registry.get("arr") == first and first.aliases == ("arr",)
    assert first.notes == ""  # none given
    for name, aliases in (("pirate", ()), ("arr", ()), ("other", ["pirate"]), ("other", ["arr"])):
        with pytest.raises(LibraryError, match="already has an adapter or alias named"):
            registry.import_folder(tiny_adapters["tiny-r8-all"], tiny_base, name=name, aliases=aliases)
    for bad in ("base", "has space", "", "-dash-first", "x" * 129):
        with pytest.raises(LibraryError, match="invalid adapter name"):
            registry.import_folder(tiny_adapters["tiny-r8-all"], tiny_base, name=bad or None, aliases=[bad])
    with pytest.raises(LibraryError, match="repeat"):
        registry.import_folder(tiny_adapters["tiny-r8-all"], tiny_base, name="same", aliases=["same"])
    assert [r.name for r in registry.list_adapters()] == ["pirate"]
    assert [p.name for p in registry.adapters_dir.iterdir()] == [first.id]


def test_pin_notes_aliases_and_last_used_persist(registry, tiny_adapters, tiny_base):
    registry.import_folder(tiny_adapters["tiny-r4-qv"], tiny_base, name="a")
    assert registry.set_pinned("a").pinned
    assert registry.set_notes("a", "good at sea shanties").notes == "good at sea shanties"
    before = time.time()
    assert registry.touch("a").last_used >= before
    assert registry.add_alias("a", "alpha").aliases == ("alpha",)
    reopened = Registry(registry.root)
    assert reopened.get("alpha").pinned
    assert not reopened.set_pinned("alpha", False).pinned
    reopened.remove_alias("alpha")
    assert reopened.find("alpha") is None and reopened.get("a").aliases == ()
    for call in (
        lambda: reopened.set_pinned("nope"),
        lambda: reopened.touch("nope"),
        lambda: reopened.add_alias("nope", "x"),
        lambda: reopened.remove_alias("nope"),
        lambda: reopened.remove("nope"),
    ):
        with pytest.raises(LibraryError, match=r"no (adapter named|alias) 'nope'"):
            call()


def test_remove_deletes_the_copy_row_and_aliases_but_not_the_source(registry, tiny_adapters, tiny_base):
    source = tiny_adapters["tiny-r4-qv"]
    record = registry.import_folder(source, tiny_base, name="gone", aliases=["g"])
    registry.import_folder(tiny_adapters["tiny-r8-all"], tiny_base, name="stays")
    assert registry.remove("g") == record
    assert not record.path.exists() and registry.find("gone") is None
    assert [r.name for r in registry.list_adapters()] == ["stays"]
    assert [p.name for p in registry.adapters_dir.iterdir()] == [registry.get("stays").id]
    assert (source / "adapter_model.safetensors").is_file()
    assert registry.import_folder(source, tiny_base, name="g").name == "g"  # the alias is free again


def test_a_locked_library_fails_the_import_and_leaves_nothing(tmp_path, tiny_adapters, tiny_base):
    registry = Registry(tmp_path / "library", busy_timeout_s=0.2)
    registry.import_folder(tiny_adapters["tiny-r8-all"], tiny_base, name="kept")
    other = sqlite3.connect(registry.db_path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another writer holds the lock
    try:
        with pytest.raises(LibraryError, match="locked by another writer"):
            registry.import_folder(tiny_adapters["tiny-r4-qv"], tiny_base, name="blocked")
        with pytest.raises(LibraryError, match="locked by another writer"):
            registry.remove("kept")
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert [r.name for r in registry.list_adapters()] == ["kept"]
    kept = registry.get("kept")
    assert [p.name for p in registry.adapters_dir.iterdir()] == [kept.id]
    assert (kept.path / "adapter_model.safetensors").is_file()
    assert registry.import_folder(tiny_adapters["tiny-r4-qv"], tiny_base, name="blocked").name == "blocked"


def test_leftovers_of_a_crash_are_swept_at_the_next_start(registry, tiny_adapters, tiny_base):
    """Only while no write is under way: an old staging folder of a running write is not
    provably abandoned (a restore may take an hour, a moved folder keeps its old mtime)."""
    kept = registry.import_folder(tiny_adapters["tiny-r4-qv"], tiny_base)
    old = time.time() - 2 * 3600
    leftovers = [registry.adapters_dir / n for n in (".tmp-old", ".trash-old.0123", "0123orphan")]
    for folder in leftovers:
        folder.mkdir()
        (folder / "adapter_model.safetensors").write_bytes(b"partial")
        os.utime(folder, (old, old))
    registry.archives_dir.mkdir()
    archive = registry.archives_dir / ".tmp-0123.tar.gz"
    archive.write_bytes(b"partial")
    with writing(registry.lock_path):  # another writer is under way: nothing is touched
        Registry(registry.root)
    assert all(folder.is_dir() for folder in leftovers) and archive.is_file() and kept.path.is_dir()
    Registry(registry.root)  # no writer holds the lock: every leftover goes
    assert not any(folder.exists() for folder in leftovers) and not archive.exists()
    assert kept.path.is_dir()


def test_schema_version_and_wal_journal(registry, tmp_path):
    conn = sqlite3.connect(registry.db_path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    newer = tmp_path / "newer"
    newer.mkdir()
    conn = sqlite3.connect(newer / "library.sqlite3")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(RuntimeError, match="newer MultiLoRA Studio"):
        Registry(newer)


def test_adapter_of_another_base_revision_is_flagged_and_refused_unless_overridden(
    registry, tiny_adapters, tiny_base, retrained_base
):
    record = registry.import_folder(tiny_adapters["tiny-r4-qv"], tiny_base, name="a")
    other = describe_base(str(retrained_base))
    assert other.digest != tiny_base.digest and other.shapes == tiny_base.shapes
    assert record.base_status(tiny_base.digest) == "ok"
    assert record.base_status(other.digest) == "mismatch"
    assert record.base_status("") == "unknown"
    assert registry.check_base("a", tiny_base.digest) == record
    with pytest.raises(BaseMismatchError, match=f"validated against base {tiny_base.name}"):
        registry.check_base("a", other.digest)
    assert registry.check_base("a", other.digest, override=True) == record


def test_load_into_a_running_engine_checks_the_base_pins_and_records_use(
    registry, tiny_adapters, tiny_base, retrained_base
):
    from multilora_studio.engine import Engine, EngineConfig, SamplingParams

    registry.import_folder(tiny_adapters["tiny-r4-qv"], tiny_base, name="qv")
    registry.set_pinned("qv")
    config = EngineConfig(
        model=str(retrained_base),
        device="cpu",
        dtype="float32",
        max_loras=2,
        max_lora_rank=8,
        max_model_len=128,
    )
    with Engine(config) as engine:
        with pytest.raises(BaseMismatchError):
            registry.load_into(engine, "qv")
        assert engine.list_adapters() == []
        record = registry.load_into(engine, "qv", override=True)
        assert record.last_used is not None
        assert [a.name for a in engine.list_adapters()] == ["qv"]
        out = engine.generate(["Hello"], ["qv"], SamplingParams(max_tokens=3, temperature=0.0))[0]
        assert len(out.token_ids) == 3

        def qv_slots() -> list:
            metrics = engine.metrics()
            return [s for s in metrics.slots if s.adapter == "qv"] if metrics else []

        wait_until(qv_slots, what="qv in a slot")
        slots = qv_slots()
        assert slots and slots[0].pinned


def test_rename_keeps_aliases_and_refuses_taken_or_bad_names(registry, tiny_adapters, tiny_base):
    registry.import_folder(tiny_adapters["tiny-r4-qv"], tiny_base, name="a", aliases=["alpha"])
    registry.import_folder(tiny_adapters["tiny-r8-all"], tiny_base, name="b")
    renamed = registry.rename("alpha", "first")
    assert renamed.name == "first" and renamed.aliases == ("alpha",)
    assert registry.find("a") is None and registry.get("alpha").name == "first"
    with pytest.raises(LibraryError, match="b"):
        registry.rename("first", "b")
    with pytest.raises(LibraryError):
        registry.rename("first", "bad name with spaces")
    with pytest.raises(LibraryError, match="no adapter named 'zzz'"):
        registry.rename("zzz", "x")
    assert sorted(r.name for r in registry.list_adapters()) == ["b", "first"]


def test_a_hub_adapter_is_found_by_its_repository_and_commit_only(registry, tiny_adapters, tiny_base):
    commit, other = "a" * 40, "b" * 40
    pulled = registry.register_hub(
        tiny_adapters["tiny-r4-qv"],
        tiny_base,
        repo_id="org/pirate",
        revision=commit,
        requested_revision="main",
    )
    registry.import_folder(tiny_adapters["tiny-r8-all"], tiny_base, name="org/poet")  # a folder, not a pull
    found = registry.find_hub("org/pirate", commit)
    assert found is not None and (found.name, found.source, found.revision) == (
        pulled.name,
        "org/pirate",
        commit,
    )
    assert found.aliases == pulled.aliases and found.rank == 4
    assert registry.find_hub("org/pirate", other) is None  # another commit of the repository
    assert registry.find_hub("org/poet", commit) is None  # an imported folder is not a pull


def test_removing_an_alias_that_does_not_exist_is_refused(registry, tiny_adapters, tiny_base):
    registry.import_folder(tiny_adapters["tiny-r4-qv"], tiny_base, name="pirate", aliases=["arr"])
    with pytest.raises(LibraryError, match=r"^no alias 'yo' in the library$"):
        registry.remove_alias("yo")
    registry.remove_alias("arr")
    assert registry.get("pirate").aliases == ()
    with pytest.raises(LibraryError, match=r"^no alias 'arr' in the library$"):
        registry.remove_alias("arr")


def test_an_adapters_record_carries_the_warm_lists_of_its_own_aliases(registry, tiny_adapters, tiny_base):
    """Read one at a time or listed, each adapter shows the lists of its aliases, in their
    order, and no other adapter's."""
    registry.import_folder(tiny_adapters["tiny-r4-qv"], tiny_base, name="pirate", aliases=["arr", "ahoy"])
    registry.import_folder(tiny_adapters["tiny-r8-all"], tiny_base, name="poet", aliases=["verse"])
    registry.import_folder(tiny_adapters["tiny-r16-mlp"], tiny_base, name="chef")
    registry.set_alias_warm("arr", ["chef", "poet"])
    registry.set_alias_warm("ahoy", ["verse"])  # by the alias: its adapter is listed
    expected = {"pirate": (("ahoy", ("poet",)), ("arr", ("chef", "poet"))), "poet": (), "chef": ()}
    assert {name: registry.get(name).alias_warm for name in expected} == expected
    assert {r.name: r.alias_warm for r in registry.list_adapters()} == expected


def test_a_record_of_another_base_is_refused_unless_overridden(registry, tiny_adapters, tiny_base):
    record = registry.import_folder(tiny_adapters["tiny-r4-qv"], tiny_base, name="pirate")
    other = "f" * 64
    message = (
        f"adapter 'pirate' was validated against base {record.base_name} (sha256 {record.base_digest[:12]}), "
        f"the loaded base has sha256 {'f' * 12}; its outputs may be wrong. Override to load it anyway"
    )
    with pytest.raises(BaseMismatchError) as caught:
        check_record_base(record, other)  # override is off unless asked for
    assert str(caught.value) == message
    check_record_base(record, other, override=True)
    check_record_base(record, record.base_digest)


def test_loading_reads_the_weights_so_a_copy_damaged_after_import_is_refused_at_once(
    registry, tiny_adapters, tiny_base, tiny_model_dir
):
    """``load_into`` reads the adapter's weights when it loads it (not at its first request):
    a library copy whose weights went bad after the import is refused by the load itself."""
    from safetensors.torch import load_file, save_file

    from multilora_studio.adapters.peft_adapter import AdapterError
    from multilora_studio.engine import Engine, EngineConfig

    record = registry.import_folder(tiny_adapters["tiny-r4-qv"], tiny_base, name="qv")
    weights = record.path / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    next(t for k, t in tensors.items() if "lora_B" in k)[0, 0] = float("nan")
    save_file(tensors, str(weights))
    config = EngineConfig(
        model=str(tiny_model_dir), device="cpu", dtype="float32", max_loras=2, max_model_len=128
    )
    with Engine(config) as engine:
        with pytest.raises(AdapterError, match="holds NaN or Inf weights"):
            registry.load_into(engine, "qv")
        assert engine.list_adapters() == []
        # the window's path: registered without reading the weights, refused at first use
        assert serve_record(engine, registry.get("qv"), preload=False) is None
        assert [a.name for a in engine.list_adapters()] == ["qv"]


def test_the_listing_gives_each_adapter_its_own_aliases(registry, tiny_adapters, tiny_base):
    registry.import_folder(tiny_adapters["tiny-r4-qv"], tiny_base, name="pirate", aliases=["arr", "ahoy"])
    registry.import_folder(tiny_adapters["tiny-r8-all"], tiny_base, name="poet", aliases=["verse"])
    registry.import_folder(tiny_adapters["tiny-r16-mlp"], tiny_base, name="chef")
    expected = {"pirate": ("ahoy", "arr"), "poet": ("verse",), "chef": ()}
    assert {r.name: r.aliases for r in registry.list_adapters()} == expected
    assert {name: registry.get(name).aliases for name in expected} == expected


def test_scores_are_recorded_together_and_read_back_newest_first_under_the_adapters_name(
    registry, tiny_adapters, tiny_base
):
    from multilora_studio.adapters.registry_schema import EvalScoreRecord

    registry.import_folder(tiny_adapters["tiny-r4-qv"], tiny_base, name="pirate", aliases=["arr"])
    registry.import_folder(tiny_adapters["tiny-r8-all"], tiny_base, name="poet")
    old = EvalScoreRecord("arr", "style", "d" * 64, tiny_base.digest, 4, 4, 3, -1.5, "/r/old.json", 10.0)
    new = EvalScoreRecord("pirate", "style", "d" * 64, tiny_base.digest, 4, 4, 4, None, None, 20.0)
    card = EvalScoreRecord("poet", "card", "", "", None, None, None, None, None, 15.0, "acc", 31.5)
    registry.record_eval_scores([old, card])
    registry.record_eval_scores([new])
    # read by an alias or the name, each score is the adapter's, under its name
    expected = [new, dataclasses.replace(old, adapter="pirate")]
    assert registry.eval_scores("arr") == registry.eval_scores("pirate") == expected
    assert registry.eval_scores("poet") == [card]
    assert registry.latest_eval_scores() == {"pirate": new, "poet": card}
    assert registry.latest_eval_scores(counted=True) == {"pirate": new}  # a card's metric has no counts
    unknown = EvalScoreRecord("gone", "style", "d" * 64, "", 1, 1, 1, None, None, 30.0)
    with pytest.raises(LibraryError) as caught:
        registry.record_eval_scores([new, unknown])
    assert str(caught.value) == "no adapter named 'gone' in the library; no scores recorded"
    assert registry.eval_scores("pirate") == expected  # the first of that evaluation was not kept


def test_a_hub_snapshot_is_registered_where_it_is_and_removing_it_leaves_the_cache(
    registry, tiny_adapters, tiny_base, tmp_path
):
    snapshot = shutil.copytree(tiny_adapters["tiny-r4-qv"], tmp_path / "hf-cache" / "snapshots" / "c0ffee")
    other = shutil.copytree(tiny_adapters["tiny-r8-all"], tmp_path / "hf-cache" / "snapshots" / "beef")
    commit = "c" * 40
    record = registry.register_hub(
        snapshot, tiny_base, repo_id="org/pirate", revision=commit, requested_revision="main", aliases=["arr"]
    )
    fields = (record.name, record.source_kind, record.source, record.revision, record.requested_revision)
    assert fields == ("org/pirate", "hub", "org/pirate", commit, "main")
    assert (record.path, record.notes, record.aliases) == (snapshot, "", ("arr",))
    for aliases in (["arr"], ["not a name"]):  # taken, invalid: refused before anything is written
        with pytest.raises(LibraryError):
            registry.register_hub(
                other,
                tiny_base,
                repo_id="org/poet",
                revision=commit,
                requested_revision=None,
                aliases=aliases,
            )
    noted = registry.register_hub(
        other, tiny_base, repo_id="org/poet", revision=commit, requested_revision=None, notes="from the Hub"
    )
    assert (noted.requested_revision, noted.notes) == (None, "from the Hub")
    assert registry.remove("arr").id == record.id
    assert registry.find("org/pirate") is None
    # the snapshot is the shared HF cache's: it stays, every file of it
    assert sorted(p.name for p in snapshot.iterdir()) == sorted(p.name for p in other.iterdir())


def test_an_archived_adapter_whose_archive_is_gone_can_still_be_removed(registry, tiny_adapters, tiny_base):
    registry.import_folder(tiny_adapters["tiny-r4-qv"], tiny_base, name="old")
    archived = registry.archive("old")
    assert archived.archive_path is not None and archived.archive_path.is_file()
    archived.archive_path.unlink()  # deleted by hand
    assert registry.remove("old").name == "old"
    assert registry.find("old") is None
    assert [(e.event, e.reason) for e in registry.events("old")][-1] == ("removed", "")


def test_importing_a_file_or_a_missing_folder_is_refused_naming_it(registry, tiny_base, tmp_path):
    not_a_folder = tmp_path / "adapter.safetensors"
    not_a_folder.write_bytes(b"")
    for source in (not_a_folder, tmp_path / "missing"):
        with pytest.raises(LibraryError) as refused:
            registry.import_folder(source, tiny_base)
        assert str(refused.value) == f"{source} is not a folder"
    assert registry.list_adapters() == []


def test_a_record_says_which_vocabulary_rows_and_tokenizer_files_an_adapter_brings(
    registry, tiny_model_dir, tiny_base, tokenizer_dir, tmp_path
):
    from tests.fixtures import AdapterSpec, build_adapter
    from tests.token_table_fixtures import SPECS

    head = build_adapter(tiny_model_dir, SPECS["head"], tmp_path / "head")
    shutil.copy(tokenizer_dir / "tokenizer.json", head / "tokenizer.json")
    record = registry.import_folder(head, tiny_base, name="head")
    assert (record.tokens, record.tokenizer) == ("lm_head", "own tokenizer")
    plain = build_adapter(tiny_model_dir, AdapterSpec("plain", 4, 8, ("q_proj",), 3), tmp_path / "plain")
    assert registry.import_folder(plain, tiny_base).tokens == ""


def test_names_that_repeat_one_another_are_refused_naming_them(registry):
    with pytest.raises(LibraryError) as refused:
        registry.check_names("pirate", ["arr", "pirate"])
    assert str(refused.value) == "the names pirate, arr, pirate repeat one another"


def test_a_library_in_folders_that_do_not_exist_yet_makes_them(tmp_path, tiny_adapters, tiny_base):
    root = tmp_path / "home" / "studio" / "library"
    library = Registry(root)
    assert root.is_dir() and not library.read_only
    assert library.import_folder(tiny_adapters["tiny-r4-qv"], tiny_base).path.parent == library.adapters_dir


def test_the_library_database_runs_in_wal_mode(registry):
    """Readers (the window, the server) never wait for a writer (an import, a pull)."""
    with sqlite3.connect(registry.db_path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
