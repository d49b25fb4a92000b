"""Test harness: a Hub-compatible server on loopback (olah) over local git repositories.

olah (PyPI) serves the repositories under ``<mirrors>/models/<org>/<name>`` to the
real ``huggingface_hub`` client: model info, refs, trees, file downloads by branch,
tag or commit. It has no ``GET /api/models`` listing route (Hub search), so this
harness adds one thin route to olah's own FastAPI app before starting it: it
lists the local repositories with the tags the Hub derives from their model cards
(``base_model:<id>``, and ``base_model:adapter:<id>`` for PEFT repositories) and
applies the ``filter``/``search``/``author``/``limit`` parameters. Everything else
is olah as shipped.

Run as a script (``python hub_server.py CONFIG LOG_DIR``) in a child process;
``HubServer`` starts and stops it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import pytest
from starlette.requests import Request

READY_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class HubServer:
    """olah plus the listing route in a child process, serving ``mirrors`` on a free loopback port."""

    def __init__(self, mirrors: Path, workdir: Path) -> None:
        self.mirrors = mirrors
        self.workdir = workdir
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> HubServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "olah.toml"
        netloc = f"127.0.0.1:{self.port}"
        config.write_text(
            "[basic]\n"
            f'host = "127.0.0.1"\nport = {self.port}\n'
            f'repos-path = "{self.workdir / "olah-cache"}"\n'
            f'mirror-scheme = "http"\nmirror-netloc = "{netloc}"\nmirror-lfs-netloc = "{netloc}"\n'
            f'mirrors-path = ["{self.mirrors}"]\n'
            "[accessibility]\noffline = true\n"
        )
        log = (self.workdir / "server.log").open("ab")
        self.process = subprocess.Popen(
            [sys.executable, __file__, str(config), str(self.workdir / "logs")],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
        )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the Hub server exited; see {self.workdir / 'server.log'}")
            try:
                with urllib.request.urlopen(f"{self.endpoint}/api/models?limit=1", timeout=2):
                    return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the Hub server did not answer within {READY_TIMEOUT_S} s")

    def kill(self) -> None:
        """Stop at once, as a crash or a lost connection would."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def _card(repo: Path) -> dict:
    import yaml

    try:
        text = _git(repo, "show", "HEAD:README.md")
    except subprocess.CalledProcessError:
        return {}
    if not text.startswith("---"):
        return {}
    card = yaml.safe_load(text.split("---", 2)[1]) or {}
    return card if isinstance(card, dict) else {}


def _hub_time(stamp: int) -> str:
    """The Hub's timestamp format (UTC, milliseconds, Z)."""
    return datetime.fromtimestamp(stamp, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def list_local_models(mirrors: Path) -> list[dict]:
    """The Hub's listing fields for every repository under ``mirrors/models``."""
    models = []
    for repo in sorted((mirrors / "models").glob("*/*")):
        if not (repo / ".git").exists():
            continue
        card = _card(repo)
        files = _git(repo, "ls-tree", "--name-only", "HEAD").split()
        tags = [str(t) for t in card.get("tags") or []]
        library = card.get("library_name")
        if library:
            tags.append(str(library))
        bases = card.get("base_model") or []
        for base in [bases] if isinstance(bases, str) else bases:
            tags.append(f"base_model:{base}")
            if "adapter_config.json" in files:
                tags.append(f"base_model:adapter:{base}")
        repo_id = f"{repo.parent.name}/{repo.name}"
        models.append(
            {
                "_id": repo_id,
                "id": repo_id,
                "modelId": repo_id,
                "author": repo.parent.name,
                "sha": _git(repo, "rev-parse", "HEAD").strip(),
                "lastModified": _hub_time(int(_git(repo, "log", "-1", "--format=%ct"))),
                "tags": tags,
                "library_name": library,
                "downloads": 0,
                "likes": 0,
                "private": False,
            }
        )
    return models


def main(config: str, log_dir: str) -> None:
    os.environ["OLAH_CONFIG"] = config  # olah's server module reads its config from here on import
    os.environ["OLAH_LOG_PATH"] = log_dir
    import uvicorn
    from fastapi.responses import JSONResponse
    from olah import server

    settings = server.app.state.app_settings.config
    mirrors = [Path(path) for path in settings.mirrors_path]

    async def list_models(request: Request) -> JSONResponse:
        query = request.query_params
        filters, search, author = query.getlist("filter"), query.get("search"), query.get("author")
        found = [
            model
            for mirror in mirrors
            for model in list_local_models(mirror)
            if all(f in model["tags"] for f in filters)
            and (not search or search.lower() in model["id"].lower())
            and (not author or model["author"] == author)
        ]
        return JSONResponse(found[: int(query.get("limit") or len(found) or 1)])

    server.app.add_api_route("/api/models", list_models, methods=["GET"])
    server.app.router.routes.insert(0, server.app.router.routes.pop())  # before olah's catch-all routes
    uvicorn.run(server.app, host=settings.host, port=settings.port, log_level="warning")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])


def point_client_at(monkeypatch: pytest.MonkeyPatch, endpoint: str, cache: Path, offline: bool) -> None:
    """Aim the real huggingface_hub client at ``endpoint`` with its own cache.

    The session sets HF_HUB_OFFLINE=1 before huggingface_hub is imported (so nothing
    else reaches the internet), and the client reads that switch at import; these
    tests set the variable and the client's import-time copy of it together.
    """
    from huggingface_hub import constants

    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1" if offline else "0")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
