"""Test harness: a Hub-compatible server on loopback (olah) over local git repositories.

olah (PyPI) serves the repositories under ``<mirrors>/models/<org>/<name>`` to the
real ``huggingface_hub`` client: model info, refs, trees, file downloads by branch,
tag or commit. It has no ``GET /api/models`` listing route (Hub search), so this
harness adds one route to olah's own FastAPI app before starting it, answered by
``hub_listing`` from recorded Hub records and the local repositories, with the Hub's
fields, sorting, filters and limit. Everything else is olah as shipped.

Run as ``python -m tests.adapters.hub_server CONFIG LOG_DIR`` in a child process;
``HubServer`` starts and stops it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from starlette.requests import Request

READY_TIMEOUT_S = 60.0
REPO_ROOT = Path(__file__).resolve().parents[2]


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
        path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.adapters.hub_server", str(config), str(self.workdir / "logs")],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            env={**os.environ, "PYTHONPATH": path},
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


def main(config: str, log_dir: str) -> None:
    os.environ["OLAH_CONFIG"] = config  # olah's server module reads its config from here on import
    os.environ["OLAH_LOG_PATH"] = log_dir
    import uvicorn
    from fastapi.responses import JSONResponse
    from olah import server

    from tests.adapters import hub_listing

    settings = server.app.state.app_settings.config
    mirrors = [Path(path) for path in settings.mirrors_path]

    async def list_models(request: Request) -> JSONResponse:
        query = request.query_params
        try:
            found = hub_listing.search(
                hub_listing.all_models(mirrors),
                search=query.get("search"),
                author=query.get("author"),
                filters=query.getlist("filter"),
                sort=query.get("sort"),
                direction=query.get("direction"),
                limit=query.get("limit"),
                full=query.get("full", "").lower() in ("1", "true"),
                expand=query.getlist("expand") or query.getlist("expand[]"),
            )
        except hub_listing.BadQuery as error:
            return JSONResponse({"error": str(error)}, status_code=400)
        return JSONResponse(found)

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
