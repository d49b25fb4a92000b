"""What one Compare column sends to its base's engine, and what it got back since it last looked."""

from __future__ import annotations

from dataclasses import dataclass, replace

from multilora_studio.engine import Prompt, RequestOutput, SamplingParams
from multilora_studio.run_records import column_choice


@dataclass(frozen=True)
class ColumnRequest:
    """What one column sends, to base model ``base``: 'base' or the base's own name (the model
    without an adapter), an adapter or an adapter at a strength (``column_choice``), its prompt
    and its settings."""

    name: str
    prompt: Prompt
    params: SamplingParams
    base: str

    @property
    def adapter(self) -> str | None:
        return None if self.name == self.base else column_choice(self.name)[0]

    @property
    def engine_params(self) -> SamplingParams:
        """``params`` with the column's adapter strength."""
        scale = column_choice(self.name)[1]
        return self.params if scale == 1.0 else replace(self.params, adapter_scale=scale)


@dataclass
class ColumnUpdate:
    """What a column gained since the last look, and its running numbers."""

    text: str
    tokens: int
    ttft_s: float | None
    queue_s: float | None  # the wait before its first step (part of the TTFT)
    tokens_per_second: float | None
    done: bool
    output: RequestOutput | None
