"""Every file an adapter brings, read to serve it: a symbolic link is refused naming it (whether
it points at a private file or at an identical copy of the file), and so is a file past its
size cap; a Hugging Face cache snapshot's links to its own blobs are the one link followed."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from multilora_studio.adapters.adapter_config import MAX_CONFIG_BYTES
from multilora_studio.adapters.adapter_files import AdapterError
from multilora_studio.adapters.adapter_tokenizer import MAX_TEMPLATE_BYTES, MAX_TOKENIZER_FILE_BYTES
from tests.server.raw_http import call, post_json

SECRET = b"the user's private key material\n"
TEMPLATE = "{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}"  # differs from the base's
# the files an adapter brings for serving (a README is the library's, see test_library_files.py)
BROUGHT = (
    "adapter_config.json",
    "adapter_model.safetensors",
    "added_tokens.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
)


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A 0600 file outside every adapter folder."""
    path = tmp_path / "elsewhere" / "id_ed25519"
    path.parent.mkdir()
    path.write_bytes(SECRET)
    path.chmod(0o600)
    return path


@pytest.fixture
def folder(tmp_path: Path, server_adapters: dict[str, Path], tiny_model_dir: Path) -> Path:
    """An adapter that brings every kind of file: a tokenizer (the base's) and its own template."""
    copy = Path(shutil.copytree(server_adapters["tiny-r8-all"], tmp_path / "adapter"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model_dir / name, copy / name)
    (copy / "added_tokens.json").write_text("{}")
    (copy / "chat_template.jinja").write_text(TEMPLATE)
    return copy


def added(engine, name: str, folder: Path) -> AdapterError:
    """The refusal of adding ``folder`` as ``name`` (the test fails if it is added)."""
    try:
        engine.add_adapter(name, folder)
    except AdapterError as error:
        return error
    engine.remove_adapter(name)
    pytest.fail(f"{folder} was added")


def test_the_folder_serves_as_it_is(engine, folder):
    """The refusals below are the links' and the sizes', not the folder's."""
    info = engine.add_adapter("every-file", folder)
    try:
        assert info.tokenizer == "own template"  # the base's vocabulary, its own template
    finally:
        engine.remove_adapter("every-file")


@pytest.mark.parametrize("file", BROUGHT)
def test_a_link_to_an_identical_copy_is_refused(engine, folder, tmp_path, file):
    """Not only links to secrets: a link is never followed, whatever it points at."""
    outside = tmp_path / "outside" / file
    outside.parent.mkdir()
    os.replace(folder / file, outside)
    (folder / file).symlink_to(outside)
    error = added(engine, "linked", folder)
    assert str(error).startswith(f"{folder / file} is a symbolic link (to {outside})")


def test_a_linked_chat_template_does_not_reach_the_tokenizer_routes(serve, folder, secret):
    """The reported leak: a template linked to a private file rendered its bytes back."""
    (folder / "chat_template.jinja").unlink()
    (folder / "chat_template.jinja").symlink_to(secret)
    server = serve()
    load = {"lora_name": "leak", "lora_path": str(folder)}
    status, _, body = post_json(server.url, "/v1/load_lora_adapter", load)
    message = body["error"]["message"]
    assert status == 400 and "chat_template.jinja is a symbolic link" in message, body
    status, _, models = call(server.url, "GET", "/v1/models")
    assert status == 200 and "leak" not in {card["id"] for card in models["data"]}
    for path in ("/tokenize", "/v1/chat/completions"):
        payload = {"model": "leak", "messages": [{"role": "user", "content": "x"}]}
        status, _, body = post_json(server.url, path, payload)
        assert status == 404 and SECRET.decode().strip() not in json.dumps(body), (path, status, body)


@pytest.mark.parametrize(
    ("file", "cap"),
    [
        ("adapter_config.json", MAX_CONFIG_BYTES),
        ("tokenizer_config.json", MAX_TOKENIZER_FILE_BYTES),
        ("added_tokens.json", MAX_TOKENIZER_FILE_BYTES),
        ("chat_template.jinja", MAX_TEMPLATE_BYTES),
    ],
)
def test_a_file_past_its_cap_is_refused_before_it_is_read(engine, folder, file, cap):
    with open(folder / file, "r+b") as sparse:
        sparse.truncate(cap + 1)  # takes no disk blocks; a reader that reads it whole holds cap + 1 bytes
    error = added(engine, "huge", folder)
    assert str(error) == f"{folder / file} is larger than {cap >> 20} MiB"


def hub_snapshot(folder: Path, cache: Path) -> Path:
    """``folder``'s files as the Hugging Face cache lays out a snapshot: links to blobs."""
    snapshot = cache / "models--org--adapter" / "snapshots" / ("0" * 40)
    blobs = cache / "models--org--adapter" / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for number, path in enumerate(sorted(folder.iterdir())):
        shutil.copy(path, blobs / f"blob{number}")
        (snapshot / path.name).symlink_to(f"../../blobs/blob{number}")
    return snapshot


def test_a_hub_snapshots_links_to_its_blobs_are_followed(engine, folder, tmp_path):
    snapshot = hub_snapshot(folder, tmp_path / "hub")
    info = engine.add_adapter("from-the-cache", snapshot)
    try:
        assert info.tokenizer == "own template"  # the base's vocabulary, its own template
    finally:
        engine.remove_adapter("from-the-cache")


@pytest.mark.parametrize("target", ["../../blobs/../../../elsewhere/id_ed25519", "SECRET", "../blob-like"])
def test_a_snapshot_link_anywhere_but_its_blobs_is_refused(engine, folder, secret, tmp_path, target):
    snapshot = hub_snapshot(folder, tmp_path / "hub")
    (snapshot / "chat_template.jinja").unlink()
    target = target.replace("SECRET", str(secret))
    (snapshot / "chat_template.jinja").symlink_to(target)
    error = added(engine, "escaped", snapshot)
    assert str(error).startswith(f"{snapshot / 'chat_template.jinja'} is a symbolic link (to {target})")


def test_a_blob_that_is_itself_a_link_is_refused(engine, folder, secret, tmp_path):
    snapshot = hub_snapshot(folder, tmp_path / "hub")
    blob = (snapshot / "chat_template.jinja").resolve()
    blob.unlink()
    blob.symlink_to(secret)
    error = added(engine, "relinked", snapshot)
    assert str(error).startswith(f"cannot read {snapshot / 'chat_template.jinja'}")
    assert SECRET.decode().strip() not in str(error)
