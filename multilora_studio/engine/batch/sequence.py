"""One request's state as the scheduler sees it (plain Python, no torch)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from multilora_studio.engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """A request: its tokens, its adapter, its KV blocks and how far it has been computed."""

    request_id: str
    prompt_token_ids: list[int]
    adapter: str | None
    params: SamplingParams
    arrival_step: int
    output_token_ids: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None
    num_preemptions: int = 0
    # prompt positions 0..n-1 whose next token has been scored (``SamplingParams.prompt_logprobs``);
    # a recomputed prefill after a preemption does not score them again
    scored_prompt_positions: int = 0
    # the tokens that end it (unless ignore_eos): the base's EOS and its adapter tokenizer's
    eos_token_ids: tuple[int, ...] = ()

    def prompt_positions_to_score(self, start: int, stop: int) -> range:
        """The positions of chunk [start, stop) whose next prompt token still needs a log-probability."""
        if self.params.prompt_logprobs is None:
            return range(0)
        return range(max(start, self.scored_prompt_positions), min(stop, len(self.prompt_token_ids) - 1))

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def token_at(self, position: int) -> int:
        prompt_len = len(self.prompt_token_ids)
        if position < prompt_len:
            return self.prompt_token_ids[position]
        return self.output_token_ids[position - prompt_len]

    def token_slice(self, start: int, stop: int) -> list[int]:
        prompt_len = len(self.prompt_token_ids)
        if stop <= prompt_len:
            return self.prompt_token_ids[start:stop]
        if start >= prompt_len:
            return self.output_token_ids[start - prompt_len : stop - prompt_len]
        return self.prompt_token_ids[start:] + self.output_token_ids[: stop - prompt_len]

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
