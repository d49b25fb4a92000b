"""Stop strings as one line of text: comma-separated, with backslash escapes (plain Python)."""

from __future__ import annotations

ESCAPES = {"n": "\n", "t": "\t", "s": " ", "\\": "\\", ",": ","}
SPELLED = {value: f"\\{key}" for key, value in ESCAPES.items() if key != "s"}


def parse_stop_strings(line: str) -> tuple[str, ...]:
    r"""``'\n\n, END, a\,b, \sQ:'`` -> ``('\n\n', 'END', 'a,b', ' Q:')``; spaces around entries are dropped.

    ValueError for an unknown escape or a trailing backslash.
    """
    entries, current, index = [], "", 0
    while index < len(line):
        char = line[index]
        if char == "\\":
            if index + 1 >= len(line) or line[index + 1] not in ESCAPES:
                raise ValueError(
                    f"stop strings: unknown escape at {line[index : index + 2]!r} "
                    "(use \\n, \\t, \\s for a space, \\\\ or \\,)"
                )
            current += (
                "\x00" + ESCAPES[line[index + 1]] + "\x00"
            )  # marks an escaped character: never stripped
            index += 2
            continue
        if char == ",":
            entries.append(current)
            current = ""
        else:
            current += char
        index += 1
    entries.append(current)
    cleaned = (entry.strip(" ").replace("\x00", "") for entry in entries)
    return tuple(entry for entry in cleaned if entry)


def format_stop_strings(stops: tuple[str, ...]) -> str:
    """The line ``parse_stop_strings`` reads back as ``stops``."""
    return ", ".join(_spell(stop) for stop in stops)


def _spell(stop: str) -> str:
    inner = "".join(SPELLED.get(char, char) for char in stop.strip(" "))
    lead, trail = len(stop) - len(stop.lstrip(" ")), len(stop) - len(stop.rstrip(" "))
    if not stop.strip(" "):
        return "\\s" * len(stop)
    return "\\s" * lead + inner + "\\s" * trail
