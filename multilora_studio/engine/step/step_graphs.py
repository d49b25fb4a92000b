"""CUDA graphs of staged steps, one per bucket and LoRA/no-LoRA.

Two sets run on CUDA, each over a :class:`StepStaging` of its own:

- Decode steps (one token a sequence, every sequence sampling), per batch-size bucket. Each
  graph spans the bucket's sequences and runs the attention kernel's decode variant.
  Padding rows write no KV (slot -1), attend to nothing (seq_len 0) and use no adapter.
- Steps with prompt tokens (a prefill, or prompts joining running decodes) of up to
  ``MIXED_MAX_TOKENS`` tokens, per token bucket. An eager step of an 8B model costs about
  26 ms of host time launching ~550 kernels (Triton launches dominate) whatever its size,
  against 5-7 ms for a replayed decode step: every prompt that joined a running batch made
  one step four times slower (docs/dev/engine.md). Each graph takes every sequence slot
  (padding sequences have no query) and the attention kernel's prefill variant with
  ``max_query_len`` = the bucket, so its launch grids depend on the bucket alone; the
  logits of the ``max_num_seqs`` sampling rows come out of a fixed buffer.

Steps whose rows use no adapter replay a graph captured without any LoRA work. Steps with
an adapter that replaces vocabulary rows (``engine/model/token_tables.py``) replay a graph that
starts from the tokens' embeddings and ends at the sampled rows' hidden states: the
embeddings are taken before it and the logits after it, each row through its adapter's tables.
"""

from __future__ import annotations

import bisect
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from multilora_studio.engine.batch.scheduler import StepPlan
from multilora_studio.engine.model.llama import AttentionMetadata, LlamaModel, LoRAStep
from multilora_studio.engine.model.token_tables import TokenTableStep
from multilora_studio.engine.step.step_staging import StagedStep, StepStaging

log = logging.getLogger(__name__)

# Steps with more tokens than this run eagerly: their device time (tens of ms) dwarfs the launches.
MIXED_MAX_TOKENS = 512

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: (k, v) [blocks, block_size, Hkv, D]


def batch_buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to 64, then every 32, ending at ``max_num_seqs``."""
    sizes = [b for b in (1, 2, 4) if b < max_num_seqs]
    sizes += list(range(8, min(64, max_num_seqs) + 1, 8))
    sizes += list(range(96, max_num_seqs + 1, 32))
    if not sizes or sizes[-1] != max_num_seqs:
        sizes.append(max_num_seqs)
    return sorted(set(sizes))


def token_buckets(max_tokens: int) -> list[int]:
    """32, 64, 96, 128, 192, 256, 384, 512, capped at ``max_tokens`` (which ends the list)."""
    sizes = [b for b in (32, 64, 96, 128, 192, 256, 384, 512) if b < max_tokens]
    return [*sizes, max_tokens]


def forward_staged(
    model: LlamaModel,
    kv_caches: KVCaches,
    staging: StepStaging,
    bucket: int,
    uses_lora: bool,
    uses_rows: bool = False,
    embeddings: torch.Tensor | None = None,
    slot_span: int = 0,
) -> torch.Tensor:
    """Logits float32 of the staged step padded to ``bucket`` tokens: what a graph captures.

    ``uses_rows``: every group also takes the slots' per-row terms (DoRA, lora_bias), each
    token reading its slot's row (the no-adapter row for padding). ``slot_span``: the shrink
    in GEMM multiplies the A rows of the leading slots only (0: every slot). With ``embeddings``
    [bucket, H] (the tokens' embeddings, taken outside), the sampling rows' hidden states
    instead of logits.

    A decode staging gives [bucket, V], the rows of its first ``bucket`` sequences; any
    other gives [S, V], every sequence slot's sampling row. On the CPU it runs eagerly
    (tests compare it with the eager path).
    """
    if staging.one_token_per_seq:
        attn = AttentionMetadata(
            slot_mapping=staging.slot_mapping[:bucket],
            block_tables=staging.block_tables[:bucket],
            seq_lens=staging.seq_lens[:bucket],
            query_start_loc=staging.query_start_loc[: bucket + 1],
            max_query_len=1,
        )
    else:
        attn = AttentionMetadata(
            slot_mapping=staging.slot_mapping[:bucket],
            block_tables=staging.block_tables,
            seq_lens=staging.seq_lens,
            query_start_loc=staging.query_start_loc,
            max_query_len=bucket,
        )
    lora = None
    if uses_lora:
        groups = frozenset(model.spec.lora_groups)
        lora = LoRAStep(staging.lora_batch, groups, groups if uses_rows else frozenset(), slot_span)
    hidden = model.forward(
        staging.input_ids[:bucket], staging.positions[:bucket], attn, kv_caches, lora, embeddings
    )  # [bucket, H]
    rows = hidden if staging.one_token_per_seq else hidden.index_select(0, staging.logits_rows)
    return rows if embeddings is not None else model.logits(rows)


def capture_graph(work: Callable[[], None], pool: Any, device: torch.device) -> torch.cuda.CUDAGraph:
    """Run ``work`` once (its kernels compile outside the capture), then capture it."""
    work()
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        work()
    return graph


@dataclass(frozen=True)
class GraphStep:
    """A step staged for one of ``graphs``' captures (``uses_rows``: with the per-row terms)."""

    graphs: StepGraphs
    staged: StagedStep
    uses_rows: bool = False
    tokens: TokenTableStep | None = None  # adapters with token tables in the step
    slot_span: int = 0  # the leading slots the step uses (0: every slot)


class StepGraphs:
    """Captured steps over one staging, keyed by (bucket, uses_lora, uses_rows, uses_tables,
    slot_span); buckets end at its size. The graphs over every slot are captured at start
    (``capture``; without it, on the first step of their bucket, as after an engine's swap-in);
    those over fewer leading slots (``LoRAStep.slot_span``), with the per-row terms (DoRA,
    lora_bias) or between a step's token tables on the first step of their bucket that needs
    them (``model.lora.ensure_row_buffers()`` first)."""

    def __init__(
        self,
        model: LlamaModel,
        kv_caches: KVCaches,
        staging: StepStaging,
        buckets: list[int],
        pool: Any,
        capture: bool = True,
    ) -> None:
        if buckets[-1] != staging.max_tokens:
            raise ValueError(f"the largest bucket {buckets[-1]} must be the staging's {staging.max_tokens}")
        self.model = model
        self.kv_caches = kv_caches
        self.staging = staging
        self.buckets = buckets
        device = staging.input_ids.device
        self.logits = torch.zeros(
            (staging.max_seqs, model.spec.vocab_size), dtype=torch.float32, device=device
        )  # [S, V]
        hidden, dtype = model.spec.hidden_size, model.weights.embed.dtype
        self.embeddings = torch.zeros((staging.max_tokens, hidden), dtype=dtype, device=device)  # [T, H]
        self.hidden_rows = torch.zeros((staging.max_seqs, hidden), dtype=dtype, device=device)  # [S, H]
        self.graphs: dict[tuple[int, bool, bool, bool, int], torch.cuda.CUDAGraph] = {}
        self.pool = pool
        if capture:
            self.capture_all()

    def _forward(
        self,
        bucket: int,
        uses_lora: bool,
        uses_rows: bool = False,
        uses_tables: bool = False,
        slot_span: int = 0,
    ) -> None:
        embeddings = self.embeddings[:bucket] if uses_tables else None
        out = forward_staged(
            self.model, self.kv_caches, self.staging, bucket, uses_lora, uses_rows, embeddings, slot_span
        )
        (self.hidden_rows if uses_tables else self.logits)[: out.shape[0]] = out

    @torch.inference_mode()
    def capture_all(self) -> None:
        device = self.logits.device
        self.staging.clear()  # padding only: captures write no KV and use no adapter
        for bucket in reversed(self.buckets):
            for uses_lora in (False, True):
                work = functools.partial(self._forward, bucket, uses_lora)
                self.graphs[(bucket, uses_lora, False, False, 0)] = capture_graph(work, self.pool, device)
        torch.cuda.synchronize(device)
        kind = "decode steps" if self.staging.one_token_per_seq else "steps with prompt tokens"
        log.info("captured %d graphs of %s (buckets %s)", len(self.graphs), kind, self.buckets)

    def accepts(self, plan: StepPlan) -> bool:
        """Whether a captured graph can run ``plan``."""
        return self.staging.accepts(plan.chunks)

    def stage(
        self,
        plan: StepPlan,
        slot_of: dict[str | None, int],
        slot_ranks: Sequence[int],
        uses_rows: bool = False,
        tokens: TokenTableStep | None = None,
        slot_span: int = 0,
    ) -> GraphStep:
        """Write ``plan``'s inputs to the staging buffers (one copy enqueued).

        ``slot_of`` maps each adapter to its GPU slot; ``slot_ranks`` is each slot's rank;
        ``uses_rows``: an adapter of the step has per-row terms; ``tokens``: the step's
        adapters with token tables; ``slot_span``: the leading slots it uses (0: every slot).
        """
        staged = self.staging.stage(plan.chunks, slot_of, slot_ranks)
        return GraphStep(self, staged, uses_rows, tokens, slot_span)

    def bucket_of(self, tokens: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, tokens)]

    def graph_for(
        self,
        tokens: int,
        uses_lora: bool,
        uses_rows: bool = False,
        uses_tables: bool = False,
        slot_span: int = 0,
    ) -> torch.cuda.CUDAGraph:
        """The graph that runs a step of ``tokens`` tokens (its bucket's), captured now if it
        is a graph over fewer slots, with per-row terms or between token tables not yet used
        (the staged step runs once more while it is)."""
        bucket, lora = self.bucket_of(tokens), self.model.lora
        # 0: every slot, and a span changes nothing where the bucket's GEMMs hold no A rows
        narrower = lora is not None and 0 < slot_span < lora.num_slots
        span = slot_span if uses_lora and narrower and self.model.plan.shrinks_in_gemm(bucket) else 0
        key = (bucket, uses_lora, uses_rows, uses_tables, span)
        if key not in self.graphs:
            work = functools.partial(self._forward, *key)
            self.graphs[key] = capture_graph(work, self.pool, self.logits.device)
            log.info(
                "captured the graph of bucket %d (per-row terms %s, token tables %s, slots %s)",
                key[0], uses_rows, uses_tables, span or "all",
            )  # fmt: skip
        return self.graphs[key]

    def run(
        self,
        staged: StagedStep,
        uses_rows: bool = False,
        tokens: TokenTableStep | None = None,
        slot_span: int = 0,
    ) -> torch.Tensor:
        """Replay the graph of the step's bucket; logits [N, V] float32 of the sampling
        sequences (a view of a static buffer without ``tokens``; [N, width] with them)."""
        uses_rows = staged.uses_lora and uses_rows
        if tokens is None:
            self.graph_for(staged.num_tokens, staged.uses_lora, uses_rows, False, slot_span).replay()
            return self.logits[: staged.num_sampled]
        # captured (if new) before the embeddings are written: the forward updates its residual
        # stream, these embeddings, in place, and a capture runs it once first
        graph = self.graph_for(staged.num_tokens, staged.uses_lora, uses_rows, True, slot_span)
        count = staged.num_tokens
        self.embeddings[:count] = self.model.embed(self.staging.input_ids[:count], tokens.embed)
        graph.replay()
        return self.model.logits(self.hidden_rows[: staged.num_sampled], tokens.head, tokens.width)
