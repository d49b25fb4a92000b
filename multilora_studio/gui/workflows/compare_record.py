"""A finished Compare send as a run record (``run_records.py``): every column's prompt, settings,
adapter identity and output, and the engine it ran on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from multilora_studio.adapters.registry import Registry
from multilora_studio.deploy import BasePool
from multilora_studio.gui.compare_chat import Conversation
from multilora_studio.gui.workflows.compare_answers import AnswerState
from multilora_studio.gui.workflows.compare_requests import ColumnRequest
from multilora_studio.run_records import (
    AdapterDigests,
    ColumnOutput,
    ColumnOverrides,
    ColumnRun,
    EngineRecord,
    RunRecord,
    RunSettings,
    column_choice,
)

Identities = dict[str, tuple[str, str | None]]  # column -> its adapter's weights digest, library source


@dataclass
class Sending:
    """A send in flight on ``pool``: the chat before it (restored if it fails), the chat with the new
    turn, the shared settings and each column's own, and what each column sends."""

    pool: BasePool
    previous: Conversation | None
    conversation: Conversation
    shared: RunSettings
    overrides: list[ColumnOverrides]
    settings: list[RunSettings]
    requests: list[ColumnRequest]

    @property
    def bases(self) -> list[str]:
        """The send's bases, in the order their columns are submitted."""
        return list(dict.fromkeys(request.base for request in self.requests))


def identify(
    names: list[str], paths: dict[str, Path], registry: Registry, digests: AdapterDigests
) -> Identities:
    """Each adapter column's weights digest and library source (slow: off the GUI thread)."""
    found = {}
    for name in names:
        adapter = column_choice(name)[0]
        assert adapter is not None  # names holds adapter columns only
        record = registry.find(adapter)
        found[name] = (digests.of(paths[adapter]), None if record is None else record.source_label)
    return found


def record_of(
    sending: Sending, answers: list[AnswerState], engines: dict[str, EngineRecord], identities: Identities
) -> RunRecord | None:
    """The send's record (None when no base of it ran: there is nothing to rerun it on)."""
    engine = next((engines[base] for base in sending.bases if base in engines), None)
    if engine is None:
        return None
    several = len(sending.bases) > 1
    conversation = sending.conversation
    columns = []
    for index, (request, answer) in enumerate(zip(sending.requests, answers, strict=True)):
        output = answer.output
        digest, source = identities.get(request.name, (None, None))
        columns.append(
            ColumnRun(
                name=request.name,
                adapter=request.adapter,
                adapter_scale=column_choice(request.name)[1],
                adapter_digest=digest,
                adapter_source=source,
                overrides=sending.overrides[index],
                settings=sending.settings[index],
                prompt=request.prompt,
                output=ColumnOutput(
                    text=answer.text,
                    token_ids=tuple(output.token_ids) if output is not None else (),
                    finish_reason=answer.finish_reason,
                    error=answer.error,
                    ttft_s=answer.ttft_s,
                    queue_s=answer.queue_s,
                    tokens_per_second=answer.tokens_per_second,
                ),
                base=engines.get(request.base) if several else None,
            )
        )
    return RunRecord(
        engine=engine,
        raw=conversation.raw,
        system_prompt=conversation.system_prompt,
        user_turns=tuple(conversation.user_turns),
        shared=sending.shared,
        columns=tuple(columns),
    )
