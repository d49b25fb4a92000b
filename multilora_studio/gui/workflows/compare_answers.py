"""A Compare column's answers as plain state: its conversation, the last answer as it streams, its
numbers, and where it leaves the base's answer (character and token divergence)."""

from __future__ import annotations

from collections.abc import Callable

from multilora_studio.divergence import TokenDivergence
from multilora_studio.engine import RequestOutput
from multilora_studio.gui.diff import first_difference
from multilora_studio.gui.workflows.compare_requests import ColumnUpdate
from multilora_studio.gui.workflows.events import Event
from multilora_studio.run_records import BASE, ColumnOverrides

# what ``AnswerState.changed`` says changed
TURN = "turn"  # a new answer began (or the conversation was drawn again)
GREW = "grew"  # more text streamed in
COUNTED = "counted"  # only the numbers changed
FINISHED = "finished"  # the answer ended
DIVERGED = "diverged"  # the first difference from the base is known
SAME = "same"  # the answer ended the same as the base's
SCORED = "scored"  # token divergences from the base arrived
OWN_SETTINGS = "own settings"
# how the difference line reads
QUIET, FAILED, DEPARTED = "quiet", "failed", "departed"


def format_seconds(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f} s"


def overrides_label(overrides: ColumnOverrides) -> str:
    """A column's own settings in a few words ("T 0.8 · max 3"); empty when it takes the shared ones."""
    parts = []
    if overrides.temperature is not None:
        parts.append(f"T {overrides.temperature:g}")
    if overrides.max_tokens is not None:
        parts.append(f"max {overrides.max_tokens}")
    if overrides.stop is not None:
        parts.append(f"{len(overrides.stop)} stop")
    if overrides.seed is not None:
        parts.append(f"seed {overrides.seed}")
    return " · ".join(parts)


class AnswerState:
    """One column (``name``, on base model ``base``: named in its header when not empty); ``reference``:
    the model without an adapter (default: the column named 'base'). Every change is announced on
    ``changed(kind)``."""

    def __init__(self, name: str, base: str = "", reference: bool | None = None) -> None:
        self.name = name
        self.base = base
        self.reference = name == BASE if reference is None else reference
        self.changed = Event()
        self.overrides = ColumnOverrides()
        self.decode: Callable[[int], str] = str
        self._start([], "")

    def begin_turn(self, history: list[tuple[str, str]], user_text: str) -> None:
        """Start a new answer to ``user_text`` after ``history`` (this column's earlier turns)."""
        self._start(history, user_text)
        self.changed.emit(TURN)

    def show_turn(self, history: list[tuple[str, str]], user_text: str, answer: str) -> None:
        """Show a turn already answered (``answer``), as a chat held it before a send that failed."""
        self._start(history, user_text)
        self.text = answer
        self.changed.emit(TURN)

    def _start(self, history: list[tuple[str, str]], user_text: str) -> None:
        self.history = list(history)
        self.user_text = user_text  # the user turn the last answer replies to
        self.text = ""
        self.tokens = 0
        self.ttft_s: float | None = None
        self.queue_s: float | None = None
        self.tokens_per_second: float | None = None
        self.prompt_tokens: int | None = None
        self.cached_tokens: int | None = None  # prompt tokens whose KV came from the prefix cache
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.output: RequestOutput | None = None
        self.done = False
        self.diverges_at: int | None = None
        self.agreed = 0  # prefix length known to agree with the base
        self.divergence: list[TokenDivergence] | None = None
        self.difference = "reference" if self.reference else ""
        self.difference_tone = QUIET

    def apply(self, update: ColumnUpdate) -> None:
        """Append new text and take the latest numbers."""
        self.text += update.text
        self.tokens = update.tokens
        self.ttft_s = update.ttft_s
        self.queue_s = update.queue_s
        self.tokens_per_second = update.tokens_per_second
        self.prompt_tokens = update.prompt_tokens
        self.cached_tokens = update.cached_tokens
        if update.done and update.output is not None:
            self._finish(update.output)
            self.changed.emit(FINISHED)
        else:
            self.changed.emit(GREW if update.text else COUNTED)

    def _finish(self, output: RequestOutput) -> None:
        self.done = True
        self.output = output
        self.finish_reason = output.finish_reason
        self.error = output.error
        if output.text and output.text != self.text:  # the final text is authoritative
            self.text = output.text
        if output.error:
            self.difference, self.difference_tone = output.error, FAILED

    def mark_divergence(self, index: int) -> None:
        """The answer leaves the base's at character ``index``."""
        self.diverges_at = index
        words = len(self.text[:index].split())
        self.difference = f"differs from base at char {index} (after {words} words)"
        self.difference_tone = DEPARTED
        self.changed.emit(DIVERGED)

    def mark_same(self) -> None:
        self.difference = "same as base"
        self.changed.emit(SAME)

    def show_divergence(self, tokens: list[TokenDivergence], decode: Callable[[int], str]) -> None:
        """The last answer's tokens scored against the base (``decode`` names the alternatives)."""
        self.divergence = tokens
        self.decode = decode
        self.changed.emit(SCORED)

    def show_overrides(self, overrides: ColumnOverrides) -> None:
        self.overrides = overrides
        self.changed.emit(OWN_SETTINGS)

    def stats(self) -> str:
        """The numbers line: tokens, tokens/s, TTFT, the prompt's tokens and those the prefix cache
        held, queue time, and how it finished."""
        rate = "-" if self.tokens_per_second is None else f"{self.tokens_per_second:.1f} tok/s"
        parts = [f"{self.tokens} tok", rate, f"TTFT {format_seconds(self.ttft_s)}"]
        if self.prompt_tokens is not None:
            cached = "" if self.cached_tokens is None else f" ({self.cached_tokens} cached)"
            parts.append(f"prompt {self.prompt_tokens} tok{cached}")
        if self.queue_s is not None:
            parts.append(f"queued {format_seconds(self.queue_s)}")
        if self.done:
            parts.append(self.finish_reason or "done")
        return " · ".join(parts)

    def divergence_summary(self) -> str:
        tokens = self.divergence or []
        more = sum(token.delta > 0 for token in tokens)
        mean = sum(token.delta for token in tokens) / max(1, len(tokens))
        return f"vs base: mean Δ log p {mean:+.2f} nats; {more} of {len(tokens)} tokens more likely (green)"


def check_differences(answers: list[AnswerState], bases: list[str]) -> None:
    """Each adapter column against its own base's column without an adapter, when there is one:
    where it first differs, or that it ended the same."""
    references = {base: answer for answer, base in zip(answers, bases, strict=True) if answer.reference}
    for answer, on in zip(answers, bases, strict=True):
        base = references.get(on)
        if base is None or answer is base or answer.diverges_at is not None:
            continue
        index = first_difference(base.text, answer.text, base.done, answer.done, answer.agreed)
        if index is not None:
            answer.mark_divergence(index)
        else:
            answer.agreed = min(len(base.text), len(answer.text))
            if base.done and answer.done:
                answer.mark_same()
