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
    # the first position its adapter applies to (``activation.adapter_start``): 0 for LoRA and
    # base rows; an activated LoRA's positions before it run, and cache KV, as the base model's
    adapter_start: int = 0
    # What besides its tokens makes its KV what it is (``prefix_cache.kv_salt``): the base's alone
    # for positions before ``adapter_start``, the base's with its adapter's weights version and
    # strength from there on.
    base_salt: bytes = b""
    kv_salt: bytes = b""
    adapter_version: int | None = None  # which loading of its adapter's weights it runs with
    block_keys: list[bytes] = field(default_factory=list)  # prefix-cache keys of its full blocks
    num_indexed_blocks: int = 0  # its first blocks the prefix cache indexes
    num_planned_blocks: int = 0  # its first blocks it will have indexed once its prompt is computed
    # prompt tokens its first admission found in the prefix cache (None until it is admitted)
    num_cached_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.params.prompt_logprobs is not None:
            self.scored_prompt_positions = self.first_scored_position

    @property
    def first_scored_position(self) -> int:
        """The first prompt position whose next token is scored (``prompt_logprobs_start`` - 1)."""
        return max(0, min(self.params.prompt_logprobs_start, len(self.prompt_token_ids)) - 1)

    def block_salt(self, index: int, block_size: int) -> bytes:
        """The salt of block ``index``: the base's when the whole block precedes ``adapter_start``,
        the adapter's with the offset where it starts when that lies inside the block."""
        first = index * block_size
        if first + block_size <= self.adapter_start:
            return self.base_salt
        if first >= self.adapter_start:
            return self.kv_salt
        return self.kv_salt + (self.adapter_start - first).to_bytes(4, "little")

    def block_owner(self, index: int, block_size: int) -> int | None:
        """The adapter version whose weights made block ``index``'s KV; None: the base's alone."""
        return None if (index + 1) * block_size <= self.adapter_start else self.adapter_version

    @property
    def max_cached_tokens(self) -> int:
        """Tokens a prefix-cache hit may cover: never the last known one (its logits are needed),
        nor a prompt position still to be scored."""
        limit = self.num_tokens - 1
        if self.params.prompt_logprobs is not None:
            limit = min(limit, self.scored_prompt_positions)
        return max(0, limit)

    def prompt_positions_to_score(self, start: int, stop: int) -> range:
        """The positions of chunk [start, stop) whose next prompt token still needs a log-probability."""
        if self.params.prompt_logprobs is None:
            return range(0)
        return range(max(start, self.scored_prompt_positions), min(stop, len(self.prompt_token_ids) - 1))

    def base_prefix(self, start: int, stop: int) -> int:
        """How many leading positions of chunk [start, stop) run without its adapter."""
        return max(0, min(stop, self.adapter_start) - start)

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
