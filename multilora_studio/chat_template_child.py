"""The child process that renders chat templates for ``engine.template_sandbox``.

It imports jinja2 and transformers' own renderer (no torch, nothing of the engine), so it
starts in about a second and renders exactly as ``apply_chat_template`` does. Its address
space is limited, so a template that builds a huge string fails with MemoryError here
instead of taking the server's memory.
"""

from __future__ import annotations

import os
from multiprocessing.connection import Connection
from typing import Any

READY = "ready"
# Replies: (OK, text), (TOO_LONG, length), (NO_MEMORY, None) or (FAILED, message)
OK, TOO_LONG, NO_MEMORY, FAILED = "ok", "too long", "no memory", "failed"

# One render: the template source, the conversation, the tools (or None), the template's other
# variables (special tokens, add_generation_prompt, ...) and the longest text it may return.
Job = tuple[str, list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any], int]


def _limit_memory(headroom: int) -> None:
    """Cap this process's address space at what it maps now plus ``headroom`` bytes (Linux)."""
    try:
        import resource

        with open("/proc/self/statm", encoding="ascii") as statm:
            mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (mapped + headroom, mapped + headroom))
    except (ImportError, OSError, ValueError):  # not Linux: the deadline and the output cap remain
        pass


def render(job: Job) -> tuple[str, Any]:
    """One reply for ``job``; never raises."""
    from transformers.utils.chat_template_utils import render_jinja_template

    renderer: Any = render_jinja_template  # returns (texts, generation indices), annotated as str
    source, conversation, tools, variables, max_chars = job
    try:
        rendered, _ = renderer([conversation], tools=tools, chat_template=source, **variables)
    except MemoryError:
        return NO_MEMORY, None
    except Exception as error:  # the template's own errors (raise_exception, undefined names, ...)
        return FAILED, str(error)
    text = rendered[0]
    if len(text) > max_chars:
        return TOO_LONG, len(text)
    return OK, text


def serve(conn: Connection, memory_headroom: int) -> None:
    """The child's loop: one job in, one reply out, until the parent closes the pipe."""
    from transformers.utils.chat_template_utils import render_jinja_template  # noqa: F401  # import once, now

    _limit_memory(memory_headroom)
    conn.send(READY)
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        conn.send(render(job))
