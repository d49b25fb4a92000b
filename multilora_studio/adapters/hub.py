"""The Hugging Face Hub through ``huggingface_hub``: search, resolve a revision, download into the HF cache.

Settings are read from the environment at call time (``HF_ENDPOINT``,
``HF_HUB_CACHE``/``HF_HOME``, ``HF_HUB_OFFLINE``), so a running application
follows them. Downloads go to the standard HF cache and report progress per
byte; a pull that fails or is cancelled removes what it added to the cache
(``cache_transaction``).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from filelock import FileLock
from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import ExpandModelProperty_T
from tqdm.auto import tqdm

from multilora_studio.adapters.hub_revisions import COMMIT, revision_problem
from multilora_studio.paths import data_dir

log = logging.getLogger(__name__)

Progress = Callable[[float, str], None]
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?$")
ADAPTER_TAG = "base_model:adapter:{base}"
REACH_TIMEOUT_S = 3.0  # how long a search waits to learn whether the Hub answers at all


class HubError(RuntimeError):
    """A Hub operation that failed, with what to do about it."""


class PullCancelled(HubError):
    """The user cancelled a download."""


class HubNotFoundError(HubError):
    """The repository or revision does not exist (or is private)."""


class HubUnreachableError(HubError):
    """The Hub did not answer."""


class PullTooLarge(HubError):
    """The files a pull would download are over its byte limit."""


@dataclass(frozen=True)
class HubSettings:
    """Where the Hub is and where its files are cached, read from the environment."""

    endpoint: str
    cache_dir: Path
    offline: bool

    @classmethod
    def from_env(cls) -> HubSettings:
        env = os.environ
        hf_home = env.get("HF_HOME")
        cache = env.get("HF_HUB_CACHE") or (str(Path(hf_home) / "hub") if hf_home else constants.HF_HUB_CACHE)
        offline = env.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
        return cls(
            endpoint=(env.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/"),
            cache_dir=Path(cache).expanduser(),
            offline=offline or constants.HF_HUB_OFFLINE,
        )


@dataclass(frozen=True)
class Snapshot:
    """One repository at one commit: its files (with sizes when the Hub told them)."""

    repo_id: str
    revision: str  # the commit sha
    requested: str | None  # what was asked for
    files: dict[str, int | None]


@dataclass(frozen=True)
class HubModel:
    """One search result."""

    repo_id: str
    tags: tuple[str, ...]
    downloads: int | None
    likes: int | None
    last_modified: str | None


def parse_repo_ref(text: str) -> tuple[str, str | None]:
    """``org/name@rev`` into ``("org/name", "rev")``; the revision is optional, and is a commit
    hash or a git branch or tag name (``revision_problem``)."""
    repo_id, sep, revision = text.strip().partition("@")
    if not REPO_ID.match(repo_id) or ".." in repo_id or (sep and not revision):
        raise HubError(f"{text!r} is not a Hub repository id; use ORG/NAME or ORG/NAME@REVISION")
    problem = revision_problem(revision) if revision else None
    if problem is not None:
        raise HubError(f"{text!r} does not name a Hub revision: {problem}")
    return repo_id, revision or None


def check_reachable(endpoint: str, timeout: float = REACH_TIMEOUT_S) -> None:
    """HubError unless a TCP connection to ``endpoint``'s host opens within ``timeout`` seconds.

    Name resolution is not bounded by socket timeouts, so the whole attempt runs on a daemon
    thread: without a network a search says so within ``timeout`` instead of after the
    resolver's and the HTTP client's retries.
    """
    parts = urlsplit(endpoint)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    outcome: list[BaseException | None] = []

    def attempt() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
        except OSError as error:
            outcome.append(error)
        else:
            outcome.append(None)

    thread = threading.Thread(target=attempt, name="hub-reach", daemon=True)
    thread.start()
    thread.join(timeout)
    if not outcome:
        raise HubError(f"the Hub at {endpoint} did not answer within {timeout:g} s: are you offline?")
    if outcome[0] is not None:
        error = outcome[0]
        kind = type(error).__name__
        raise HubError(f"cannot reach the Hub at {endpoint} ({kind}: {error}): are you offline?")


# the listing fields a search result shows (HubModel)
SEARCH_FIELDS: tuple[ExpandModelProperty_T, ...] = ("downloads", "likes", "lastModified", "tags")


def search_adapters(
    base_model: str, text: str | None = None, limit: int = 20, settings: HubSettings | None = None
) -> list[HubModel]:
    """Adapters the Hub lists for ``base_model`` (its ``base_model:adapter:`` tag), most downloaded first."""
    settings = settings or HubSettings.from_env()
    if settings.offline:
        raise HubError("searching the Hub needs a connection; HF_HUB_OFFLINE is set")
    check_reachable(settings.endpoint)
    api = HfApi(endpoint=settings.endpoint)
    with _hub_errors(base_model, None, settings):
        found = api.list_models(
            filter=[ADAPTER_TAG.format(base=base_model)],
            search=text or None,
            sort="downloads",
            limit=limit,
            expand=list(SEARCH_FIELDS),  # the Hub's default listing leaves out lastModified
        )
        return [
            HubModel(
                repo_id=m.id,
                tags=tuple(m.tags or ()),
                downloads=m.downloads,
                likes=m.likes,
                last_modified=m.last_modified.isoformat() if m.last_modified else None,
            )
            for m in found
        ]


def resolve(repo_id: str, revision: str | None, settings: HubSettings) -> Snapshot:
    """The commit and files of ``repo_id@revision`` (from the cache alone when offline)."""
    if settings.offline:
        return _resolve_cached(repo_id, revision, settings)
    api = HfApi(endpoint=settings.endpoint)
    with _hub_errors(repo_id, revision, settings):
        info = api.model_info(repo_id, revision=revision or "main")
        sha = info.sha
        if sha is None or not COMMIT.match(sha):
            raise HubError(f"{settings.endpoint} did not say which commit {repo_id}@{revision} is")
        files = {
            entry.path: getattr(entry, "size", None)
            for entry in api.list_repo_tree(repo_id, revision=sha, recursive=True)
            if hasattr(entry, "size")
        }
    return Snapshot(repo_id, sha, revision, files)


def fetch(
    snapshot: Snapshot,
    files: Iterable[str],
    settings: HubSettings,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> Path:
    """Fetch ``files`` of the snapshot into the HF cache (call inside ``cache_transaction``).

    Returns the snapshot folder. Progress is reported per byte over all files;
    setting ``cancel`` stops the transfer at the next chunk.
    """
    files = list(files)
    folder = snapshot_folder(snapshot, settings)
    if settings.offline:
        missing = [f for f in files if not (folder / f).is_file()]
        if missing:
            raise HubError(f"offline: {', '.join(missing)} of {snapshot.repo_id} are not in the HF cache")
        return folder
    meter = _Meter(sum(snapshot.files.get(f) or 0 for f in files), progress, cancel)
    for file in files:
        meter.check()
        meter.report(f"downloading {snapshot.repo_id}/{file}")
        with _hub_errors(snapshot.repo_id, snapshot.requested, settings):
            hf_hub_download(
                snapshot.repo_id,
                file,
                revision=snapshot.revision,
                cache_dir=settings.cache_dir,
                endpoint=settings.endpoint,
                tqdm_class=meter.bar_class(),
            )
        meter.finish_file(snapshot.files.get(file) or 0)
    _record_ref(snapshot, settings)
    meter.report(f"downloaded {snapshot.repo_id}@{snapshot.revision[:12]}", done=True)
    return folder


@contextmanager
def cache_transaction(repo_id: str, settings: HubSettings) -> Iterator[None]:
    """Undo what the block adds to the repository's HF cache folder if it raises.

    Files that were in the cache before stay. A lock per repository keeps two pulls
    of the same repository (threads or processes) from undoing each other's files.
    """
    repo_dir = repo_cache_dir(repo_id, settings.cache_dir)
    locks = data_dir() / "locks"
    locks.mkdir(exist_ok=True)
    with FileLock(str(locks / f"pull-{repo_dir.name}.lock")):
        existed = repo_dir.exists()
        before = set(_entries(repo_dir))
        try:
            yield
        except BaseException:
            if not existed:
                shutil.rmtree(repo_dir, ignore_errors=True)
                shutil.rmtree(settings.cache_dir / ".locks" / repo_dir.name, ignore_errors=True)
            else:
                for path in sorted(set(_entries(repo_dir)) - before, reverse=True):
                    if path.is_dir() and not path.is_symlink():
                        shutil.rmtree(path, ignore_errors=True)
                    else:
                        path.unlink(missing_ok=True)
            log.info("removed the partial pull of %s from the HF cache", repo_id)
            raise


def _record_ref(snapshot: Snapshot, settings: HubSettings) -> None:
    """Write ``refs/<branch or tag>`` (the HF cache's record of which commit a name meant).

    Files are fetched by commit so a moving branch cannot mix two commits; the ref
    is what lets offline mode find the snapshot by the name that was asked for.
    """
    name = snapshot.requested or "main"
    if COMMIT.match(name):
        return
    refs = repo_cache_dir(snapshot.repo_id, settings.cache_dir) / "refs"
    ref = refs / name
    if revision_problem(name) is not None or not os.path.normpath(ref).startswith(f"{refs}{os.sep}"):
        raise HubError(f"{name!r} is not a revision name the HF cache can record")
    ref.parent.mkdir(parents=True, exist_ok=True)
    staging = ref.with_name(f".{ref.name}.{os.getpid()}.tmp")
    staging.write_text(snapshot.revision)
    os.replace(staging, ref)


def snapshot_folder(snapshot: Snapshot, settings: HubSettings) -> Path:
    return repo_cache_dir(snapshot.repo_id, settings.cache_dir) / "snapshots" / snapshot.revision


def repo_cache_dir(repo_id: str, cache_dir: Path) -> Path:
    """The HF cache folder of a model repository (``models--org--name``)."""
    return cache_dir / "--".join(["models", *repo_id.split("/")])


def _resolve_cached(repo_id: str, revision: str | None, settings: HubSettings) -> Snapshot:
    try:
        folder = Path(
            snapshot_download(repo_id, revision=revision, cache_dir=settings.cache_dir, local_files_only=True)
        )
    except LocalEntryNotFoundError:
        raise HubError(
            f"offline (HF_HUB_OFFLINE): {repo_id}@{revision or 'main'} is not in the HF cache at "
            f"{settings.cache_dir}; pull it once while online"
        ) from None
    files: dict[str, int | None] = {
        str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*") if p.is_file()
    }
    return Snapshot(repo_id, folder.name, revision, files)


@contextmanager
def _hub_errors(repo_id: str, revision: str | None, settings: HubSettings) -> Iterator[None]:
    """Turn client and network errors into HubError messages a person can act on."""
    where = f"{repo_id}@{revision}" if revision else repo_id
    try:
        yield
    except HubError:
        raise
    except GatedRepoError:
        raise HubError(
            f"{repo_id} is gated; accept its terms on the Hub and log in (hf auth login)"
        ) from None
    except RepositoryNotFoundError:
        raise HubNotFoundError(
            f"{where} was not found on {settings.endpoint}: check the repository id and revision "
            "(private repositories need a login: hf auth login)"
        ) from None
    except RevisionNotFoundError:
        raise HubNotFoundError(
            f"revision {revision!r} of {repo_id} was not found on {settings.endpoint}"
        ) from None
    except OfflineModeIsEnabled:
        raise HubError(f"{where}: the Hub client is in offline mode (HF_HUB_OFFLINE)") from None
    except Exception as error:  # network and server errors of whichever HTTP stack the client uses
        kind = type(error).__name__
        if isinstance(error, OSError) or any(
            w in kind for w in ("Connect", "Timeout", "Network", "Protocol")
        ):
            raise HubUnreachableError(
                f"{where}: could not reach {settings.endpoint} ({kind}: {error})"
            ) from error
        raise HubError(f"{where}: unexpected answer from {settings.endpoint} ({kind}: {error})") from error


class _Meter:
    """Byte progress over several files, with a cancel check on every chunk."""

    def __init__(self, total: int, progress: Progress | None, cancel: threading.Event | None) -> None:
        self.total = total
        self.done = 0
        self.current = 0
        self.progress = progress
        self.cancel = cancel
        self.message = ""

    def check(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise PullCancelled("download cancelled")

    def advance(self, n: float) -> None:
        self.current += int(n)
        self.check()
        self.report(self.message)

    def finish_file(self, size: int) -> None:
        self.done += max(size, self.current)
        self.current = 0

    def report(self, message: str, done: bool = False) -> None:
        self.message = message
        if self.progress is not None:
            fraction = 1.0 if done or not self.total else min(1.0, (self.done + self.current) / self.total)
            self.progress(fraction, message)

    def bar_class(self) -> type[tqdm]:
        meter = self

        class Bar(tqdm):
            """A silent progress bar that feeds the meter (the client calls ``update`` per chunk)."""

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                kwargs.pop("name", None)
                super().__init__(*args, **{**kwargs, "disable": True})

            def update(self, n: float | None = 1) -> bool | None:
                meter.advance(n or 0)
                return None

        return Bar


def _entries(folder: Path) -> Iterator[Path]:
    if folder.is_dir():
        yield from folder.rglob("*")
