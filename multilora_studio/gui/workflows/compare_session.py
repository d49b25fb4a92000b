"""Compare as a plain model: a chat with the ticked columns, its sends, edits, reruns, divergence and
exports (the Compare view binds its widgets to it and runs what it plans on the engine).

A send asks every column the message at once: a new chat (the ticked columns, the system prompt),
a follow-up (every column with its own history) or a resend from a turn being edited. The view
runs the planned ``Sending`` and hands back each column's updates; a finished send becomes a run
record (kept in the history, exported), a failed one restores the chat as it was.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

from multilora_studio.adapters.registry import Registry
from multilora_studio.deploy import BasePool
from multilora_studio.gui.compare_bases import column_base_of
from multilora_studio.gui.compare_chat import Conversation
from multilora_studio.gui.compare_export import Comparison, to_json, to_markdown
from multilora_studio.gui.workflows.compare_answers import AnswerState, check_differences
from multilora_studio.gui.workflows.compare_choices import AdapterChoices
from multilora_studio.gui.workflows.compare_divergence import DivergenceScoring, Scored, divergence_wanted
from multilora_studio.gui.workflows.compare_inputs import TOKENS, CompareInputs
from multilora_studio.gui.workflows.compare_record import Identities, Sending, identify, record_of
from multilora_studio.gui.workflows.compare_requests import ColumnRequest, ColumnUpdate
from multilora_studio.gui.workflows.compare_rerun import changed_bases, rerun_requests
from multilora_studio.gui.workflows.events import Event, Field, Observable
from multilora_studio.gui.workflows.remembered import Store
from multilora_studio.run_records import (
    AdapterDigests,
    ColumnOverrides,
    EngineRecord,
    RunHistory,
    RunRecord,
)

# ``changed`` names beside the fields: the columns were replaced; the chat, a send in flight or
# the comparison changed
COLUMNS, CHAT = "columns", "chat"
NOT_READY = "The engine is not ready yet (see the status bar)."


class CompareSession(Observable):
    """The chat, the send in flight (``sending``), each column's answers (``answers``, on
    ``column_bases``) and the last finished comparison. ``told(text, kind)`` carries what the
    person is told (an empty text: nothing now)."""

    editing = Field[int | None](None)  # the user turn being edited, if any
    summary = Field("")  # one line on the send: running, finished, scoring

    def __init__(
        self, pools: Callable[[], BasePool | None], registry: Registry, history: RunHistory | None = None
    ) -> None:
        super().__init__()
        self.pools = pools
        self.registry = registry
        self.history = history or RunHistory()
        self.digests = AdapterDigests()
        self.inputs = CompareInputs()
        self.choices = AdapterChoices(pools)
        self.told = Event()
        self.conversation: Conversation | None = None
        self.sending: Sending | None = None
        self.answers: list[AnswerState] = []
        self.column_bases: list[str] = []  # the base model each column runs on
        self.comparison: Comparison | None = None
        self.divergence_busy = False

    def tell(self, text: str, kind: str = "error") -> None:
        self.told.emit(text, kind)

    # ---------------------------------------------------------------- what may be done now

    @property
    def running(self) -> bool:
        return self.sending is not None

    @property
    def can_follow_up(self) -> bool:
        chat = self.conversation
        return not self.running and chat is not None and chat.turns > 0 and not chat.raw

    @property
    def can_edit(self) -> bool:
        return not self.running and self.conversation is not None and self.conversation.turns > 0

    @property
    def can_export(self) -> bool:
        return not self.running and self.comparison is not None

    def turn_labels(self) -> list[str]:
        """The chat's user turns, numbered, each by its first line."""
        turns = self.conversation.user_turns if self.conversation is not None else []
        return [f"{number}. {text.splitlines()[0] if text else ''}" for number, text in enumerate(turns, 1)]

    # ---------------------------------------------------------------- sends

    def start(self) -> Sending | None:
        """The message as a new chat with the ticked columns (or resent from the turn being edited)."""
        if self.editing is not None:
            return self._resend(self.editing)
        names = self.choices.ticked()
        if not names:
            self.tell("Tick at least one adapter or the base model.", "warning")
            return None
        conversation = Conversation(names, self.inputs.system_prompt.strip(), self.inputs.raw)
        return self._send(conversation, new_columns=True)

    def follow_up(self) -> Sending | None:
        """The message as the next turn to every column of the chat, each with its own history."""
        if self.conversation is None or self.conversation.turns == 0:
            return self.start()
        if self.conversation.raw:
            self.tell("A raw prompt has no turns: untick Raw prompt and Run a new chat.", "warning")
            return None
        return self._send(copy.deepcopy(self.conversation), new_columns=False)

    def sweep_selected(self, selected: str | None) -> None:
        """Sweep the strength of the selected column's adapter (or the first ticked adapter's)."""
        adapter = self.choices.sweep_target(selected)
        if adapter is None:
            self.tell("Select an adapter to sweep its strength.", "warning")
        else:
            self.choices.sweep(adapter)

    def edit_turn(self, turn: int) -> bool:
        """Put user turn ``turn`` (0-based) in the message; the next start resends the chat from there."""
        if self.conversation is None or not 0 <= turn < self.conversation.turns:
            self.tell("Pick a turn of the chat to edit.", "info")
            return False
        self.editing = turn
        self.inputs.message = self.conversation.user_turns[turn]
        return True

    def cancel_edit(self) -> None:
        self.editing = None

    def new_chat(self) -> None:
        """Forget the chat (its runs stay in the history)."""
        if self.running:
            return
        self.cancel_edit()
        self.conversation = None
        self._replace_columns([], [])
        self.comparison = None
        self.changed.emit(CHAT)
        self.summary = ""

    def _resend(self, turn: int) -> Sending | None:
        assert self.conversation is not None
        conversation = copy.deepcopy(self.conversation)
        conversation.cut(turn)
        return self._send(conversation, new_columns=False)

    def _send(self, conversation: Conversation, new_columns: bool) -> Sending | None:
        """Ask ``conversation`` the message and plan its send; a problem is told."""
        if self.running:
            return None
        pool = self.pools()
        if pool is None:
            self.tell(NOT_READY, "warning")
            return None
        text = self.inputs.message.strip()
        if not text:
            self.tell("Type a prompt first.", "warning")
            return None
        try:
            shared = self.inputs.shared_settings()
            conversation.ask(text)
            overrides = [self.choices.own_settings(name) for name in conversation.names]
            settings = [shared.with_overrides(o) for o in overrides]
            requests = [
                ColumnRequest(name, conversation.prompt(i), s.sampling_params(), column_base_of(pool, name))
                for i, (name, s) in enumerate(zip(conversation.names, settings, strict=True))
            ]
        except ValueError as error:
            self.tell(str(error))
            return None
        sending = Sending(pool, self.conversation, conversation, shared, overrides, settings, requests)
        self._launch(sending, new_columns)
        return sending

    def _launch(self, sending: Sending, new_columns: bool) -> None:
        self.tell("")
        self.cancel_edit()
        conversation = self.conversation = sending.conversation
        requests = sending.requests
        bases = [request.base for request in requests]
        names = [answer.name for answer in self.answers]
        if new_columns or names != conversation.names or bases != self.column_bases:
            several = len(sending.pool.names) > 1
            answers = [AnswerState(r.name, r.base if several else "", r.adapter is None) for r in requests]
            self._replace_columns(answers, bases)
        for index, answer in enumerate(self.answers):
            answer.show_overrides(sending.overrides[index])
            answer.begin_turn(conversation.history(index), conversation.user_turns[-1])
        self.sending = sending
        self.comparison = None
        self.changed.emit(CHAT)
        turn = f"turn {conversation.turns}: " if conversation.turns > 1 else ""
        batch = "one batch" if len(sending.bases) == 1 else "one batch per base"
        self.summary = f"{turn}{len(requests)} requests in {batch} on {', '.join(sending.bases)}…"

    def _replace_columns(self, answers: list[AnswerState], bases: list[str]) -> None:
        self.answers, self.column_bases = answers, bases
        self.changed.emit(COLUMNS)

    def side_work(self, sending: Sending) -> Callable[[], Identities]:
        """What the send's launch thread does once its requests are queued: identify its adapters."""
        pool = sending.pool
        paths = {name: path for base in pool.names for name, path in pool.adapters_of(base).items()}
        names = [r.name for r in sending.requests if r.adapter is not None and r.adapter in paths]
        return lambda: identify(names, paths, self.registry, self.digests)

    # ---------------------------------------------------------------- a send's progress and end

    def apply(self, index: int, update: ColumnUpdate) -> None:
        """Column ``index`` streamed ``update``."""
        if self.sending is None or index >= len(self.answers):
            return
        self.answers[index].apply(update)
        check_differences(self.answers, self.column_bases)

    def finish(
        self, updates: list[ColumnUpdate], engines: dict[str, EngineRecord], identities: Identities
    ) -> None:
        """Every column ended (``updates``: what each gained last; ``engines``: base -> the engine its
        columns ran on): the chat takes the answers, the run is recorded and kept in the history."""
        sending = self.sending
        if sending is None:
            return
        for answer, update in zip(self.answers, updates, strict=True):
            answer.apply(update)
        check_differences(self.answers, self.column_bases)
        for index, answer in enumerate(self.answers):
            sending.conversation.answer(index, answer.text)
        record = record_of(sending, self.answers, engines, identities)
        differs = {a.name: a.diverges_at for a in self.answers if not a.reference}
        self.comparison = None if record is None else Comparison(record, differs)
        self.sending = None
        self.changed.emit(CHAT)
        tokens = sum(answer.tokens for answer in self.answers)
        several = len(sending.bases)
        runs = "one batched run" if several == 1 else f"one batched run on each of {several} bases"
        self.summary = f"{len(self.answers)} answers, {tokens} tokens in {runs}"
        try:
            if record is not None:
                self.history.add(record)
        except OSError as error:
            self.tell(f"The run could not be kept in the history: {error}", "warning")

    def fail(self, message: str) -> None:
        """The send failed before any column ran: the chat is as it was before it."""
        sending = self.sending
        self.tell(message)
        self.sending = None
        self.conversation = sending.previous if sending is not None else None
        self._show_conversation()
        self.changed.emit(CHAT)
        self.summary = ""

    def _show_conversation(self) -> None:
        """Every column's answers as ``conversation`` holds them."""
        conversation = self.conversation
        if (
            conversation is None
            or [a.name for a in self.answers] != conversation.names
            or not conversation.turns
        ):
            return
        for index, answer in enumerate(self.answers):
            answers = conversation.answers[index]
            answer.show_turn(
                list(zip(conversation.user_turns[:-1], answers[:-1], strict=False)),
                conversation.user_turns[-1],
                answers[-1] if answers else "",
            )

    # ---------------------------------------------------------------- divergence

    def divergence_due(self) -> bool:
        """Whether answers shown as tokens lack their divergence from the base."""
        missing = any(not a.reference and a.divergence is None for a in self.answers)
        return self.inputs.view == TOKENS and self.comparison is not None and not self.running and missing

    def score_divergence(self) -> DivergenceScoring | None:
        """The scoring of the last answers' divergence (None: nothing to score, or not now)."""
        pool = self.pools()
        if pool is None or self.running or self.divergence_busy:
            return None
        wanted = divergence_wanted(self.answers, self.column_bases)
        if not wanted:
            return None
        self.divergence_busy = True
        self.summary = f"scoring {len(wanted)} answers under their adapters and the base…"
        return DivergenceScoring(pool, self.comparison, wanted)

    def show_divergence(self, scoring: DivergenceScoring, scored: Scored) -> bool:
        """Show what ``scoring`` found; False when a newer run replaced its answers."""
        self.divergence_busy = False
        if self.comparison is not scoring.comparison:
            return False
        for index, tokens, decode in scored:
            self.answers[index].show_divergence(tokens, decode)
        self.summary = f"token divergence of {len(scored)} answers from the base (hover a token)"
        return True

    def divergence_failed(self, scoring: DivergenceScoring, message: str) -> None:
        self.divergence_busy = False
        if self.pools() is scoring.pool:  # not a pool stopped by a restart meanwhile
            self.tell(f"Could not score the answers: {message}")

    # ---------------------------------------------------------------- reruns

    def rerun(self, record: RunRecord) -> Sending | None:
        """Restore a past run's inputs and send it again with the prompts and settings it recorded."""
        if self.running:
            return None
        pool = self.pools()
        if pool is None:
            self.tell(NOT_READY, "warning")
            return None
        try:
            requests = rerun_requests(pool, record)
        except ValueError as error:
            self.tell(f"Cannot rerun: {error}")
            return None
        names = [column.name for column in record.columns]
        self.inputs.system_prompt = record.system_prompt
        self.inputs.raw = record.raw
        self.inputs.message = record.user_turns[-1] if record.user_turns else ""
        self.inputs.show_shared_settings(record.shared)
        for column in record.columns:
            self.choices.overrides[column.name] = column.overrides
        self.choices.choose(names)
        prompts = [column.prompt for column in record.columns]
        conversation = Conversation.from_prompts(names, prompts, record.raw, list(record.user_turns))
        overrides = [column.overrides for column in record.columns]
        settings = [column.settings for column in record.columns]
        sending = Sending(pool, self.conversation, conversation, record.shared, overrides, settings, requests)
        self._launch(sending, new_columns=True)
        warning = changed_bases(pool, record, requests)
        if warning is not None:
            self.tell(warning, "warning")
        return sending

    # ---------------------------------------------------------------- own settings, exports, memory

    def set_column_overrides(self, name: str, overrides: ColumnOverrides) -> None:
        """Give column ``name`` its own settings (from its next send on)."""
        self.choices.set_own_settings(name, overrides)
        for answer in self.answers:
            if answer.name == name:
                answer.show_overrides(overrides)

    def export(self, path: str | Path) -> Path:
        """Write the last comparison as Markdown (.md) or JSON (.json)."""
        if self.comparison is None:
            raise ValueError("run a comparison first")
        target = Path(path)
        text = to_json(self.comparison) if target.suffix == ".json" else to_markdown(self.comparison)
        target.write_text(text, encoding="utf-8")
        return target

    def save_export(self, path: str, suffix: str) -> None:
        """``export`` to ``path`` (``suffix`` added when missing); the outcome is told."""
        try:
            written = self.export(path if path.endswith(suffix) else path + suffix)
        except (OSError, ValueError) as error:
            self.tell(f"Could not write {path}: {error}")
        else:
            self.tell(f"Saved {written}", "success")

    def copy_markdown(self) -> str | None:
        """The last comparison as Markdown for the clipboard (None: no comparison yet)."""
        if self.comparison is None:
            return None
        self.summary = "Markdown copied to the clipboard"
        return to_markdown(self.comparison)

    def save_state(self, store: Store) -> None:
        self.inputs.save(store)
        self.choices.save(store)

    def restore_state(self, store: Store) -> None:
        self.inputs.restore(store)
        self.choices.restore(store)
