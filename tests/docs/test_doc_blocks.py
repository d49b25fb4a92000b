"""Every block of the user docs is an example that runs as pasted, output, or says why it is not run;
every relative link resolves."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.docs.examples import REPOSITORY, Example, problems, read_examples, user_docs

LINK = re.compile(r"\]\((?P<target>[^)\s#]+)(?:#[^)]*)?\)")


def all_examples() -> list[Example]:
    return [example for path in user_docs() for example in read_examples(path)]


def test_the_docs_have_examples_to_run():
    tags = {example.tag for example in all_examples() if example.not_run is None}
    assert {"python", "bash"} <= tags


def test_every_block_has_a_tag():
    untagged = [example.where for example in all_examples() if not example.tag]
    assert not untagged, f"blocks without a tag (python, bash, text, ...): {untagged}"


def test_every_command_block_runs_as_pasted_or_says_why_not():
    found = [problem for example in all_examples() for problem in problems(example)]
    assert not found, "\n".join(found)


def test_the_runner_reads_a_not_run_reason(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- not run: opens the window -->\n```bash\nmultilora-studio\n```\n\n```bash\nmake run\n```\n"
    )
    shown, plain = read_examples(page)
    assert shown.not_run == "opens the window" and problems(shown) == []
    assert plain.not_run is None and problems(plain) == [
        f"{plain.where}: `make run` is not a multilora-studio or curl command"
    ]


@pytest.mark.parametrize("path", [*user_docs(), *sorted((REPOSITORY / "docs" / "dev").glob("*.md"))], ids=str)
def test_relative_links_resolve(path):
    text = path.read_text(encoding="utf-8")
    missing = [
        match["target"]
        for match in LINK.finditer(text)
        if "://" not in match["target"] and not (path.parent / match["target"]).exists()
    ]
    assert not missing, f"{path.relative_to(REPOSITORY)} links to missing files: {missing}"


ISSUE_NUMBER = re.compile(r"\b[Ii]ssues? #?\d+|\(#\d+\)")
TEXT_SUFFIXES = {".py", ".md", ".sh", ".toml", ".txt", ".ps1", ".cfg", ".yml", ".yaml"}


def repository_text_files() -> list[Path]:
    """The repository's own text files (not git's, the virtual environment's or build output)."""
    skipped = {".git", ".venv", "build", "dist", "node_modules", "__pycache__", ".mypy_cache", ".ruff_cache"}
    found = []
    for folder, subfolders, names in os.walk(REPOSITORY):
        subfolders[:] = [
            name for name in subfolders if name not in skipped and not name.endswith(".egg-info")
        ]
        found += [Path(folder) / name for name in names if Path(name).suffix in TEXT_SUFFIXES]
    return found


def test_no_file_cites_issue_numbers():
    files = repository_text_files()
    assert len(files) > 100
    cited = [
        f"{path.relative_to(REPOSITORY)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if ISSUE_NUMBER.search(line)
    ]
    assert not cited, "\n".join(cited)
