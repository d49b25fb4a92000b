"""What the engine hands back: streamed deltas, final outputs and metrics snapshots (plain data)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from multilora_studio.adapters.load_latency import LoadQuantiles

# where a request's adapter was when it arrived (RequestOutput.adapter_tier), coldest first
ADAPTER_TIERS = ("disk", "loading", "host", "gpu")


class TokenLogprob(NamedTuple):
    """One token's log-probability under the model (raw logits, before any sampling filter).

    ``rank`` is 1 for the most likely token; ``top`` holds the request's k most likely tokens
    with their log-probabilities, most likely first (empty when it asked for k = 0). A named
    tuple: a scored prompt makes one per token, so it must be cheap to build.
    """

    token_id: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class TokenDelta:
    """New tokens and text of one request since its previous delta.

    ``logprobs`` has one entry per new token when the request asked for them; the delta with
    the first generated token carries the prompt's (``prompt_logprobs``, None for position 0).
    """

    request_id: str
    token_ids: list[int]
    text: str
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    logprobs: tuple[TokenLogprob, ...] = ()
    prompt_logprobs: Sequence[TokenLogprob | None] | None = None
    error_type: type[Exception] | None = None  # what ended it with reason 'error' (engine.errors)


@dataclass
class RequestOutput:
    """The whole result of one request."""

    request_id: str
    adapter: str | None
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None
    error_type: type[Exception] | None = None  # what ended it with reason 'error' (engine.errors)
    arrival_time: float = 0.0
    first_scheduled_time: float | None = None  # when a step first ran part of it (its prefill began)
    first_token_time: float | None = None
    finish_time: float | None = None
    logprobs: list[TokenLogprob] | None = None  # one per generated token, when asked for
    prompt_logprobs: Sequence[TokenLogprob | None] | None = None  # one per prompt token (None first)
    # its share of the engine's busy time: each step's seconds split over its rows by their tokens
    engine_seconds: float = 0.0
    # where its adapter was when it arrived: "gpu" (a slot), "host" (RAM), "loading", "disk"; None: base
    adapter_tier: str | None = None
    # prompt tokens whose KV the prefix cache held when it was first admitted (not computed again)
    num_cached_tokens: int = 0

    @property
    def queue_time(self) -> float | None:
        """Seconds it waited (for a batch place, KV blocks, its adapter's slot) before its first step."""
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def tokens_per_second(self) -> float | None:
        if self.finish_time is None or self.first_token_time is None or len(self.token_ids) < 2:
            return None
        span = self.finish_time - self.first_token_time
        return (len(self.token_ids) - 1) / span if span > 0 else None


@dataclass(frozen=True)
class SlotState:
    slot: int
    adapter: str | None
    pinned: bool
    in_use: int


@dataclass(frozen=True)
class AdapterLoadTimes:
    """One adapter's cold-start figures since it was added: its reads from disk into host RAM
    and its uploads from host RAM into a GPU slot, each counted, with p50 / p95 of its last
    ``ADAPTER_WINDOW`` (``adapters/load_latency.py``)."""

    adapter: str
    disk_to_host: LoadQuantiles
    host_to_gpu: LoadQuantiles


@dataclass(frozen=True)
class EngineMetrics:
    """A snapshot of the engine's state, safe to read from any thread."""

    state: str
    device: str
    steps: int
    running: int
    waiting: int
    batch_tokens: int
    batch_size: int
    distinct_adapters: int
    tokens_per_second: float
    total_generated_tokens: int
    kv_blocks_total: int
    kv_blocks_free: int
    preemptions: int
    slots: tuple[SlotState, ...]
    cpu_adapters: tuple[str, ...]
    gpu_hits: int
    gpu_misses: int
    cpu_hits: int
    cpu_misses: int
    cold_load_p50_s: float | None
    cold_load_p95_s: float | None
    device_memory_bytes: int
    adapter_loader: str = "thread"  # "thread" or "process": where adapters are read
    adapter_load_workers: int = 1  # adapter loads at once
    pinned_blocks_exhausted: int = 0  # loads kept in pageable memory: no pinned block to spare
    # Triton kernel compiles since start-up finished (each stalls the running batch), and their seconds
    kernel_compiles: int = 0
    kernel_compile_s: float = 0.0
    # the token-table pool (adapters' embedding / LM-head tables in GPU slots) and its budget
    token_tables: int = 0
    token_tables_max: int = 0
    token_table_bytes: int = 0
    token_table_budget_bytes: int = 0
    busy_seconds: float = 0.0  # the steps' seconds, schedule to sampled tokens: what requests are billed
    upload_p50_s: float | None = None  # host RAM -> GPU slot upload of an adapter (None before one)
    upload_p95_s: float | None = None
    cpu_capacity: int = 0  # adapters the host tier holds (max_cpu_loras, or sized from host memory)
    cpu_bytes: int = 0  # host memory its adapters take now
    adapter_loads: tuple[AdapterLoadTimes, ...] = ()  # every adapter loaded at least once (first loads first)
    # the prefix cache: prompt tokens looked up and found there since start-up, and the KV blocks
    # it indexes now (in use or kept for reuse; None: caching is off)
    prefix_cache_queried_tokens: int = 0
    prefix_cache_hit_tokens: int = 0
    prefix_cache_blocks: int | None = None

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """The share of looked-up prompt tokens the prefix cache held (None before a lookup)."""
        if not self.prefix_cache_queried_tokens:
            return None
        return self.prefix_cache_hit_tokens / self.prefix_cache_queried_tokens
