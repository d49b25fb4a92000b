"""docs/cli.md documents every command and flag, and is what the parsers generate."""

from __future__ import annotations

from pathlib import Path

from multilora_studio.cli import build_parser
from multilora_studio.cli.reference import commands, render

PAGE = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


def sections(text: str) -> dict[str, str]:
    """The page's sections by command: ``multilora-studio compare`` -> its text."""
    parts = text.split("\n## `")[1:]
    return {part.partition("`")[0]: part for part in parts}


def test_every_command_and_flag_is_in_docs_cli_md():
    documented = sections(PAGE.read_text())
    missing = []
    for parser, _ in commands(build_parser()):
        section = documented.get(parser.prog)
        if section is None:
            missing.append(parser.prog)
            continue
        flags = [flag for action in parser._actions for flag in action.option_strings]
        missing += [
            f"{parser.prog} {flag}"
            for flag in flags
            if flag not in ("-h", "--help") and f"`{flag}" not in section
        ]
    assert missing == [], "undocumented: run `make docs`"


def test_docs_cli_md_is_what_the_parsers_generate():
    assert PAGE.read_text() == render(), "docs/cli.md differs from the parsers: run `make docs`"


def test_the_page_names_compares_flags_version_and_verbose():
    text = PAGE.read_text()
    for flag in ("--raw", "--max-tokens N", "--temperature X", "--top-p X", "--seed N", "--layout", "--json"):
        assert f"`{flag}" in text
    assert "`--allow-other-base`" in text and "`--version`" in text and "`-v`, `--verbose`" in text
