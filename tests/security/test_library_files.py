"""Hostile adapter folders against the library's import and the loader: links, pipes, loose modes."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from multilora_studio.adapters.adapter_config import AdapterError
from multilora_studio.adapters.adapter_tokenizer import MAX_TEMPLATE_BYTES, MAX_TOKENIZER_FILE_BYTES
from multilora_studio.adapters.peft_adapter import inspect_peft_adapter
from multilora_studio.adapters.registry import LibraryError, Registry
from multilora_studio.adapters.score_import import MAX_MODEL_CARD_BYTES
from multilora_studio.cli.shared import describe_base
from tests.security.library_checks import assert_consistent, cli, one_line_error, private_modes
from tests.threads import CheckedThread

SECRET = b"the user's private key material\n"
COPIED = ("adapter_config.json", "adapter_model.safetensors", "README.md")
GUARD_S = 120.0  # a blocked open of a pipe never returns: after this the test unblocks it and fails


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "studio-home"
    monkeypatch.setenv("MULTILORA_STUDIO_HOME", str(folder))
    return folder


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A 0600 file outside every adapter folder."""
    path = tmp_path / "elsewhere" / "id_ed25519"
    path.parent.mkdir()
    path.write_bytes(SECRET)
    path.chmod(0o600)
    return path


@pytest.fixture
def folder(tmp_path: Path, tiny_adapters: dict[str, Path]) -> Path:
    """A real adapter folder of regular files, for each test to spoil."""
    copy = Path(shutil.copytree(tiny_adapters["tiny-r4-qv"], tmp_path / "adapter"))
    (copy / "README.md").write_text("# an adapter\n")
    return copy


def library_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def assert_nothing_imported(root: Path) -> None:
    registry = assert_consistent(root)
    assert registry.list_adapters() == []
    assert SECRET not in library_bytes(root)


@pytest.mark.parametrize("file", COPIED)
def test_a_link_to_a_private_file_outside_is_refused(capsys, home, folder, secret, tiny_model_dir, file):
    (folder / file).unlink()
    (folder / file).symlink_to(secret)
    message = one_line_error(
        capsys, "adapters", "add", str(folder), "--model", str(tiny_model_dir), "--name", "linked"
    )
    assert str(folder / file) in message and "symbolic link" in message and str(secret) in message
    assert_nothing_imported(home)


def test_a_link_inside_the_folder_is_refused_too(home, folder, tiny_model_dir):
    """Any link is refused, wherever it points: the folder's own files must be regular files."""
    (folder / "notes.md").write_text("# notes\n")
    (folder / "README.md").unlink()
    (folder / "README.md").symlink_to("notes.md")
    with pytest.raises(LibraryError, match=r"README\.md is a symbolic link"):
        Registry(home).import_folder(folder, describe_base(str(tiny_model_dir)), name="inner-link")
    assert_nothing_imported(home)


def test_the_folder_itself_may_be_a_link(home, folder, tmp_path, tiny_model_dir):
    """The user names the folder; only the files inside are held to regular files."""
    link = tmp_path / "link-to-adapter"
    link.symlink_to(folder)
    record = Registry(home).import_folder(link, describe_base(str(tiny_model_dir)), name="via-link")
    assert record.path.parent == home / "adapters"
    assert all(not (record.path / f).is_symlink() for f in COPIED)


def refused_without_blocking(pipe: Path, action: Callable[[], object]) -> Exception:
    """The refusal ``action`` raises, run in a thread; if it blocks on ``pipe`` the test fails
    (after opening the pipe's other end, so the blocked reader sees end-of-file and ends)."""
    errors: list[Exception] = []

    def attempt() -> None:
        with pytest.raises((AdapterError, LibraryError)) as caught:
            action()
        errors.append(caught.value)

    thread = CheckedThread(attempt, name="reads-a-pipe")
    thread.start()
    threading.Thread.join(thread, GUARD_S)
    if thread.is_alive():
        os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))
        thread.join()
        pytest.fail(f"opening {pipe} blocked")
    thread.join()
    return errors[0]


@pytest.mark.parametrize("file", COPIED)
def test_a_pipe_in_the_folder_is_refused_without_blocking(home, folder, tiny_model_dir, file):
    (folder / file).unlink()
    os.mkfifo(folder / file)
    base = describe_base(str(tiny_model_dir))
    error = refused_without_blocking(
        folder / file, lambda: Registry(home).import_folder(folder, base, name="piped")
    )
    assert str(folder / file) in str(error) and "named pipe (FIFO)" in str(error)
    assert_nothing_imported(home)


@pytest.mark.parametrize("file", ["adapter_config.json", "adapter_model.safetensors", "added_tokens.json"])
def test_loading_a_folder_with_a_pipe_for_serving_is_refused_without_blocking(folder, tiny_model_dir, file):
    """The engine loads adapters by path (--lora-modules): a pipe there must not hang the loader."""
    (folder / file).unlink(missing_ok=True)
    os.mkfifo(folder / file)
    base = describe_base(str(tiny_model_dir))
    error = refused_without_blocking(
        folder / file,
        lambda: inspect_peft_adapter(folder, base.num_layers, base.shape_of, 64, base.vocab),
    )
    assert str(folder / file) in str(error) and "named pipe (FIFO)" in str(error)


@pytest.mark.parametrize(
    ("file", "cap"),
    [
        ("README.md", MAX_MODEL_CARD_BYTES),
        ("tokenizer.json", MAX_TOKENIZER_FILE_BYTES),
        ("chat_template.jinja", MAX_TEMPLATE_BYTES),
    ],
)
def test_a_file_past_its_cap_is_refused_and_nothing_is_imported(home, folder, tiny_model_dir, file, cap):
    with open(folder / file, "ab") as sparse:
        sparse.truncate(cap + 1)  # takes no disk blocks
    with pytest.raises(AdapterError) as refused:
        Registry(home).import_folder(folder, describe_base(str(tiny_model_dir)), name="huge")
    assert str(refused.value) == f"{folder / file} is larger than {cap >> 20} MiB"
    assert_nothing_imported(home)


def test_a_large_sparse_readme_is_one_line_and_copies_nothing(capsys, home, folder, tiny_model_dir):
    with open(folder / "README.md", "r+b") as sparse:
        sparse.truncate(512 << 20)  # the reported case: 512 MiB that take no disk blocks
    message = one_line_error(capsys, "adapters", "add", str(folder), "--model", str(tiny_model_dir))
    assert message == f"{folder / 'README.md'} is larger than 1 MiB"
    assert_nothing_imported(home)
    assert sum(p.stat().st_size for p in home.rglob("*") if p.is_file()) < 1 << 20


def test_a_hub_snapshot_with_a_file_past_its_cap_is_not_registered(home, folder, tiny_model_dir):
    with open(folder / "README.md", "r+b") as sparse:
        sparse.truncate(MAX_MODEL_CARD_BYTES + 1)
    registry = Registry(home)
    with pytest.raises(AdapterError, match=r"README\.md is larger than 1 MiB"):
        registry.register_hub(
            folder,
            describe_base(str(tiny_model_dir)),
            repo_id="org/huge-card",
            revision="0" * 40,
            requested_revision=None,
        )
    assert registry.list_adapters() == []


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_library_files_are_private_whatever_the_umask(capsys, home, folder, tiny_model_dir, umask):
    previous = os.umask(umask)
    try:
        code, _, err = cli(capsys, "adapters", "add", str(folder), "--model", str(tiny_model_dir))
        assert code == 0, err
        Registry(home).set_pinned("adapter")  # a write through SQLite, whose own files are 0600 too
    finally:
        os.umask(previous)
    assert (home / "library.sqlite3").is_file() and len(list((home / "adapters").iterdir())) == 1
    assert private_modes(home) == {}


def test_an_existing_library_is_tightened_when_opened(home, folder, tiny_model_dir):
    Registry(home).import_folder(folder, describe_base(str(tiny_model_dir)), name="loose")
    for path in [home, *home.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    assert private_modes(home) != {}
    Registry(home)
    assert private_modes(home) == {}
