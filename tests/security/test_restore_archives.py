"""Archives crafted against restore (with the row's digest made to match, as someone who can
write the library could): member names that climb out of the library or are absolute, names
the manifest does not list, sizes past a file's cap, and a large member that must never be read
whole. Restore refuses each naming what is wrong; nothing is written outside the library, the
adapter stays archived and its archive in place."""

from __future__ import annotations

import hashlib
import io
import json
import re
import sqlite3
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from multilora_studio.adapters.library_errors import LibraryError
from multilora_studio.adapters.registry import Registry
from multilora_studio.util import sha256_file
from tests.security.library_checks import assert_consistent

REPO_ROOT = Path(__file__).resolve().parents[2]
BIG_BYTES = 64 << 20  # a member of zeros: 64 KB compressed


@pytest.fixture
def archived(tmp_path: Path, tiny_adapters, tiny_base) -> Registry:
    registry = Registry(tmp_path / "library")
    registry.import_folder(tiny_adapters["tiny-r4-qv"], tiny_base, name="victim")
    registry.archive("victim")
    return registry


def craft(registry: Registry, manifest_files: dict, members: list[tuple[str, bytes | int]]) -> None:
    """Replace the archive of "victim" by one with this manifest and these members (bytes, or
    a count of zeros), and make its row's digest match."""
    record = registry.get("victim")
    assert record.archive_path is not None
    with tarfile.open(record.archive_path, "w:gz") as tar:
        for name, data in [("manifest.json", json.dumps({"files": manifest_files}).encode()), *members]:
            info = tarfile.TarInfo(name)
            if isinstance(data, int):
                info.size = data
                tar.addfile(info, io.BytesIO(bytes(data)))
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    with sqlite3.connect(registry.db_path) as conn:
        digest = sha256_file(record.archive_path)
        conn.execute("UPDATE adapters SET archive_sha256 = ? WHERE id = ?", (digest, record.id))


def listed(data: bytes) -> dict:
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def refused(registry: Registry, match: str) -> None:
    before = registry.get("victim")
    with pytest.raises(LibraryError, match=match):
        registry.restore("victim")
    after = registry.get("victim")
    assert after.state == "archived" and after.archive_path == before.archive_path
    assert after.archive_path is not None and after.archive_path.is_file()
    assert_consistent(registry.root)


@pytest.mark.parametrize("name", ["../../escaped.txt", "/ABSOLUTE/escaped.txt", "sub/README.md", "notes.txt"])
def test_a_member_that_is_not_a_kept_files_bare_name_is_refused(archived, tmp_path, name):
    name = name.replace("/ABSOLUTE", str(tmp_path))
    data = b"written where it should not be\n"
    craft(archived, {name: listed(data)}, [(name, data)])
    refused(archived, re.escape(f"lists {name!r}, which is not a file the library keeps of an adapter"))
    assert not (tmp_path / "escaped.txt").exists()
    assert not any(path.name == "escaped.txt" for path in tmp_path.rglob("*"))


def test_a_member_the_manifest_does_not_list_is_refused(archived):
    data = b"{}"
    craft(
        archived, {"adapter_config.json": listed(data)}, [("adapter_config.json", data), ("README.md", data)]
    )
    refused(archived, r"holds 'README.md', which its manifest does not list")


def test_an_archive_without_an_adapter_config_is_refused(archived):
    weights = b"not much of an adapter"
    craft(archived, {"adapter_model.safetensors": listed(weights)}, [("adapter_model.safetensors", weights)])
    refused(archived, r"holds no adapter_config\.json: no adapter")


def test_a_size_past_the_files_cap_is_refused_before_the_member_is_read(archived):
    craft(
        archived, {"README.md": {"bytes": (1 << 20) + 1, "sha256": "0" * 64}}, [("README.md", (1 << 20) + 1)]
    )
    refused(archived, r"lists README\.md with .*not a size of at most 1048576 bytes")


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads its peak memory from /proc")
def test_a_large_member_is_streamed_not_read_whole(archived):
    """A 64 MiB member whose bytes do not match the manifest: restore reads it in chunks."""
    craft(
        archived,
        {"adapter_model.safetensors": {"bytes": BIG_BYTES, "sha256": "0" * 64}},
        [("adapter_model.safetensors", BIG_BYTES)],
    )
    probe = (  # VmHWM: this process's peak resident memory (ru_maxrss would count the parent's)
        "import sys\n"
        "from pathlib import Path\n"
        "from multilora_studio.adapters.registry import LibraryError, Registry\n"
        "def peak_kib():\n"
        "    return int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1])\n"
        "registry = Registry(Path(sys.argv[1]))\n"
        "before = peak_kib()\n"
        "try:\n"
        "    registry.restore('victim')\n"
        "except LibraryError as error:\n"
        "    print(error)\n"
        "print(peak_kib() - before)\n"
    )
    child = subprocess.run(
        [sys.executable, "-c", probe, str(archived.root)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    message, grown_kib = child.stdout.splitlines()
    assert "adapter_model.safetensors in the archive" in message and "is damaged" in message, child.stderr
    assert int(grown_kib) < 16 << 10  # KiB: a few chunks, not the member's 64 MiB
    assert archived.get("victim").state == "archived"
