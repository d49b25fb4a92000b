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
    """What a column gained since the last look, and its running numbers (``prompt_tokens``: its
    prompt's; ``cached_tokens``: those the prefix cache held, known once its first step ran)."""

    text: str
    tokens: int
    ttft_s: float | None
    queue_s: float | None  # the wait before its first step (part of the TTFT)
    tokens_per_second: float | None
    done: bool
    output: RequestOutput | None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None


def prompt_counts(output: RequestOutput) -> tuple[int | None, int | None]:
    """``output``'s prompt tokens and those the prefix cache held (None: no prompt, or not run yet)."""
    prompt = len(output.prompt_token_ids) or None
    cached = output.num_cached_tokens if output.first_scheduled_time is not None else None
    return prompt, cached
