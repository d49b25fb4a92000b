"""What a Hub revision may be: a commit hash, or a branch or tag name as git allows one.

A revision becomes part of paths in the HF cache (``refs/<name>``), so one that git would
refuse (``../x``, ``a//b``, ``x.lock``) is refused before anything is asked of the Hub.
"""

from __future__ import annotations

import re

COMMIT = re.compile(r"^[0-9a-f]{40}$")
MAX_REVISION_CHARS = 255
# git check-ref-format: no control characters, space, ~ ^ : ? * [ \ anywhere
FORBIDDEN = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")


def revision_problem(revision: str) -> str | None:
    """Why ``revision`` is neither a commit hash nor a valid git ref name; None when it is one."""
    if COMMIT.match(revision):
        return None
    if not revision or len(revision) > MAX_REVISION_CHARS:
        return f"a revision has 1 to {MAX_REVISION_CHARS} characters"
    if FORBIDDEN.search(revision):
        return "a revision may not hold spaces, control characters or any of ~ ^ : ? * [ \\"
    if revision == "@" or "@{" in revision or ".." in revision:
        return "a revision may not be @ or hold @{ or .."
    parts = revision.split("/")
    if any(not part or part.startswith(".") or part.endswith(".lock") for part in parts):
        return "each /-separated part of a revision is non-empty, without a leading . or a .lock ending"
    if revision.endswith("."):
        return "a revision may not end with ."
    return None
