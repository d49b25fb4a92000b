"""The docs' tables of settings, from their declarations (``engine/settings.py``): a field, its
default and its meaning per row.

``python -m multilora_studio.cli.settings_table [PATH]`` (``make docs``) rewrites each table of the
page (default ``docs/python-api.md``) between its markers, ``<!-- settings: EngineConfig -->`` and
``<!-- end of settings -->``; ``render(page)`` is what a test compares the page with.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from multilora_studio.engine import EngineConfig
from multilora_studio.engine.settings import Declared, declared

DEFAULT_PATH = Path("docs/python-api.md")
TABLES: dict[str, type] = {"EngineConfig": EngineConfig}  # the name a page's marker gives -> its class
BLOCK = re.compile(r"(<!-- settings: (\w+) -->\n).*?(<!-- end of settings -->)", re.DOTALL)


def default_text(item: Declared) -> str:
    """A default as the table writes it: text and None as code, numbers and True/False as they are."""
    value = item.default
    return f"`{value}`" if value is None or isinstance(value, str) else repr(value)


def table(cls: type) -> str:
    """The table of ``cls``'s declared fields, in its order."""
    rows = ["| field | default | meaning |", "| --- | --- | --- |"]
    rows += [f"| `{item.name}` | {default_text(item)} | {item.setting.doc} |" for item in declared(cls)]
    return "\n".join(rows) + "\n"


def render(page: str) -> str:
    """``page`` with each table between markers made again from its class's declarations."""
    return BLOCK.sub(lambda found: found[1] + table(TABLES[found[2]]) + found[3], page)


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    path = Path(args[0]) if args else DEFAULT_PATH
    path.write_text(render(path.read_text()))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
