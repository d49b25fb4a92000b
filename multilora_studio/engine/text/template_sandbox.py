"""Chat templates an adapter brings, rendered in child processes with a deadline and an output cap.

A chat template is a program. Jinja's sandbox keeps it away from Python's internals, but not
from looping for hours or building a string of gigabytes; an adapter's template comes with
the adapter (from the Hub, say), so it is not trusted the way the base model's is. Its
renders run in spawned children (``chat_template_child``): the caller waits at most
``deadline_s`` for one, after which that child is killed (the next render starts a new one);
a child's address space is capped; a rendering longer than ``max_chars`` is refused. At most
``workers`` renders run at once; a render that cannot get a child within ``deadline_s`` is
refused as busy. Nothing here waits without a bound, so no thread is held by a template.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from multiprocessing.process import BaseProcess
from typing import Any

from jinja2 import TemplateError

from multilora_studio.chat_template_child import FAILED, NO_MEMORY, OK, READY, TOO_LONG, Job, serve
from multilora_studio.spawned import main_module_hidden

log = logging.getLogger(__name__)

RENDER_DEADLINE_S = 2.0  # a render of a chat prompt takes milliseconds
CHARS_PER_TOKEN = 32  # a rendering may be this many characters per token of the context window
START_TIMEOUT_S = 60.0  # a child imports jinja2 and transformers' renderer (about a second)
MEMORY_HEADROOM = 1 << 30  # bytes a child may map beyond what it has after its imports
WORKERS = 2  # renders at once (children)


class TemplateLimitError(ValueError):
    """A chat template that ran past its deadline, its memory or its output cap, or failed."""


class TemplateBusy(RuntimeError):
    """No child could take the render (all busy past the deadline, or none started): retry."""


class _Child:
    """One spawned renderer and the parent's end of its pipe."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, theirs = context.Pipe()
        self.process: BaseProcess = context.Process(
            target=serve, args=(theirs, MEMORY_HEADROOM), name="chat-template", daemon=True
        )
        with main_module_hidden():
            self.process.start()
        theirs.close()
        if not self.conn.poll(START_TIMEOUT_S) or self._receive() != READY:
            self.kill()
            raise TemplateBusy(f"the chat template renderer did not start within {START_TIMEOUT_S:g} s")

    def _receive(self) -> Any:
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            return None

    def call(self, job: Job, deadline_s: float) -> tuple[str, Any] | None:
        """The child's reply to ``job``; None when it did not answer within ``deadline_s`` or died."""
        try:
            self.conn.send(job)
            reply = self.conn.recv() if self.conn.poll(deadline_s) else None
        except (EOFError, OSError):  # it died, or ``close`` ended it
            return None
        return reply if isinstance(reply, tuple) else None

    def kill(self) -> None:
        self.process.kill()
        self.process.join()
        self.conn.close()


class TemplateSandbox:
    """Renders chat templates in children; ``render`` has ``apply_chat_template``'s result (text).

    A rendering may be ``CHARS_PER_TOKEN`` characters per token of ``max_model_len`` (a prompt
    longer than the context is refused anyway). Thread-safe; children start on first use or on
    ``warm`` (and again in the background after one is killed); ``close`` ends them.
    """

    def __init__(
        self, max_model_len: int, deadline_s: float = RENDER_DEADLINE_S, workers: int = WORKERS
    ) -> None:
        self.max_chars = CHARS_PER_TOKEN * max_model_len
        self.deadline_s = deadline_s
        self._slots = threading.BoundedSemaphore(workers)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a child became idle, or a start ended
        self._idle: list[_Child] = []
        self._busy: set[_Child] = set()
        self._starting = 0
        self._closed = False

    def render(self, tokenizer: Any, messages: list[dict[str, Any]], **template: Any) -> str:
        """``tokenizer.apply_chat_template(messages, tokenize=False, **template)``, in a child."""
        tools = template.pop("tools", None)
        source = tokenizer.get_chat_template(None, tools)
        variables = {**tokenizer.special_tokens_map, **template}
        # as apply_chat_template does: keys whose value is None are left out
        conversation = [{key: value for key, value in m.items() if value is not None} for m in messages]
        kind, value = self._run((source, conversation, tools, variables, self.max_chars))
        if kind == OK:
            return str(value)
        if kind == TOO_LONG:
            raise TemplateLimitError(
                f"the chat template wrote {value} characters; an adapter's template may write at most "
                f"{self.max_chars} ({CHARS_PER_TOKEN} per token of max_model_len)"
            )
        if kind == NO_MEMORY:
            raise TemplateLimitError(
                f"the chat template needed more than {MEMORY_HEADROOM >> 20} MiB of memory to render"
            )
        assert kind == FAILED
        raise TemplateError(value)  # as the template raised it in-process

    def warm(self) -> None:
        """Start a child in the background unless one is idle or starting, so that the next
        render need not wait for one to import its renderer."""
        with self._lock:
            if self._closed or self._idle or self._starting:
                return
            self._starting += 1
        threading.Thread(target=self._start_idle, name="chat-template-start", daemon=True).start()

    def _start_idle(self) -> None:
        try:
            child: _Child | None = _Child()
        except TemplateBusy as error:
            log.warning("%s", error)
            child = None
        with self._lock:
            self._starting -= 1
            if child is not None and not self._closed:
                self._idle.append(child)
                child = None
            self._changed.notify_all()
        if child is not None:
            child.kill()

    def _run(self, job: Job) -> tuple[str, Any]:
        if not self._slots.acquire(timeout=self.deadline_s):
            raise TemplateBusy("every chat template renderer is busy; retry shortly")
        try:
            child = self._take()
            reply = child.call(job, self.deadline_s)
            with self._lock:
                self._busy.discard(child)
                keep = reply is not None and not self._closed
                if keep:
                    self._idle.append(child)
                    self._changed.notify_all()
            if not keep:
                child.kill()
                self.warm()
            if reply is None:
                raise TemplateLimitError(
                    f"the chat template did not finish rendering within {self.deadline_s:g} s"
                )
            return reply
        finally:
            self._slots.release()

    def _take(self) -> _Child:
        """An idle child, one being started (waited for), or a new one started here."""
        with self._lock:
            while not self._closed and not self._idle and self._starting:
                if not self._changed.wait(START_TIMEOUT_S):
                    break
            if self._closed:
                raise TemplateBusy("the chat template renderer is shut down")
            if self._idle:
                child = self._idle.pop()
                self._busy.add(child)
                return child
        child = _Child()
        with self._lock:
            self._busy.add(child)
        return child

    def close(self) -> None:
        """End every child at once (a render in progress fails)."""
        with self._lock:
            self._closed = True
            children = [*self._idle, *self._busy]
            self._idle.clear()
            self._changed.notify_all()
        for child in children:
            child.kill()
