"""Local git repositories laid out the way olah serves them (``<mirrors>/models/<org>/<name>``)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

GIT_IDENTITY = ("-c", "user.name=Studio Tests", "-c", "user.email=tests@multilora.invalid")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *GIT_IDENTITY, *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout.strip()


def model_card(base_model: str | None, library: str | None = "peft", tags: tuple[str, ...] = ()) -> str:
    lines = ["---"]
    if base_model:
        lines.append(f"base_model: {base_model}")
    if library:
        lines.append(f"library_name: {library}")
    if tags:
        lines.append("tags:")
        lines.extend(f"- {tag}" for tag in tags)
    return "\n".join([*lines, "---", "", "A repository made by the test harness.", ""])


class LocalRepos:
    """Creates repositories and commits; remembers every commit sha by (repo, label)."""

    def __init__(self, mirrors: Path) -> None:
        self.mirrors = mirrors
        self.shas: dict[tuple[str, str], str] = {}

    def path(self, repo_id: str) -> Path:
        return self.mirrors / "models" / repo_id

    def commit(
        self,
        repo_id: str,
        label: str,
        files: dict[str, str | bytes | Path],
        tag: str | None = None,
        remove: tuple[str, ...] = (),
    ) -> str:
        """Write ``files`` (text, bytes or a file to copy), drop ``remove``, commit; returns the sha."""
        repo = self.path(repo_id)
        if not repo.exists():
            repo.mkdir(parents=True)
            git(repo, "init", "-q", "-b", "main")
        for name in remove:
            git(repo, "rm", "-q", name)
        for name, content in files.items():
            target = repo / name
            if isinstance(content, Path):
                shutil.copyfile(content, target)
            elif isinstance(content, bytes):
                target.write_bytes(content)
            else:
                target.write_text(content)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", label)
        if tag:
            git(repo, "tag", tag)
        sha = git(repo, "rev-parse", "HEAD")
        self.shas[(repo_id, label)] = sha
        return sha

    def add_adapter(
        self, repo_id: str, label: str, folder: Path, base_model: str, tag: str | None = None
    ) -> str:
        """Commit a PEFT folder's files with a model card naming its base model."""
        files: dict[str, str | bytes | Path] = {"README.md": model_card(base_model, tags=("lora",))}
        files.update({p.name: p for p in folder.iterdir() if p.is_file() and p.name != "README.md"})
        return self.commit(repo_id, label, files, tag)
