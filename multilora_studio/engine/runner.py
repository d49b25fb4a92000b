"""Runs one scheduled step on the device: builds the step's tensors, runs the model, samples.

Owns every device tensor (weights, KV cache, LoRA slots); used only from the
engine's worker thread.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from multilora_studio.engine.block_manager import BlockManager
from multilora_studio.engine.config import EngineConfig
from multilora_studio.engine.device_parking import DeviceParking, tensors_of
from multilora_studio.engine.dora import BaseProjection, base_row_norms
from multilora_studio.engine.grammar import apply_token_masks
from multilora_studio.engine.kernel_warmup import warm_up_kernels, warmup_steps
from multilora_studio.engine.llama import AttentionMetadata, LlamaModel, LoRAStep
from multilora_studio.engine.logits_processors import apply_processors
from multilora_studio.engine.logprobs import (
    ScoredRows,
    score_chunk_rows,
    score_hidden_rows,
    score_rows,
    to_host,
)
from multilora_studio.engine.lora_weights import LoRASlotWeights
from multilora_studio.engine.model_spec import ModelSpec
from multilora_studio.engine.outputs import TokenLogprob
from multilora_studio.engine.sampler import sample
from multilora_studio.engine.sampling_batch import SamplingBatch
from multilora_studio.engine.scheduler import StepPlan
from multilora_studio.engine.sequence import Sequence
from multilora_studio.engine.step_graphs import (
    MIXED_MAX_TOKENS,
    GraphStep,
    StepGraphs,
    batch_buckets,
    token_buckets,
)
from multilora_studio.engine.step_staging import StepStaging
from multilora_studio.engine.token_tables import TokenTablePool, TokenTableStep, VocabRows
from multilora_studio.engine.weights import ModelWeights, pack_for_onednn
from multilora_studio.kernels import fused_ops_cpu, lora_cpu, paged_attention_cpu
from multilora_studio.kernels.cpu_linear import onednn_packing_available
from multilora_studio.kernels.lora import LoRABatch, LoRAPlan
from multilora_studio.kernels.quant_linear import QuantPlan

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PromptScoring:
    """Prompt positions of one step whose next token is scored (``SamplingParams.prompt_logprobs``)."""

    rows: torch.Tensor  # [R] int64: rows of the step's hidden states
    targets: torch.Tensor  # [R] int64: the prompt token after each row's position
    top_k: int  # the most alternatives any of the rows asks for
    groups: list[tuple[Sequence, int, int]]  # (sequence, its first scored position, positions), in row order


@dataclass
class StepInputs:
    """Host-built tensors of one step (already on the device)."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    attn: AttentionMetadata
    slot_ids: torch.Tensor  # [T] int32, -1 = base model
    # [T] float32 adapter strength per token; None when every token's is 1.0 (costs nothing)
    token_scales: torch.Tensor | None
    logits_rows: torch.Tensor  # [N] int64: rows of the hidden states to sample from
    lora_groups: frozenset[str]
    scoring: PromptScoring | None = None
    row_groups: frozenset[str] = frozenset()  # groups with DoRA / lora_bias rows (LoRAStep)
    tokens: TokenTableStep | None = None  # the adapters with token tables, and their rows
    slot_span: int = 0  # the leading slots whose A rows the shrink in GEMM multiplies (LoRAStep)


@dataclass
class StepOutput:
    """What a step's logits gave, on the host: a token per sampling row and the log-probabilities asked."""

    tokens: list[int]
    logprobs: list[TokenLogprob | None]  # per sampling row; None where the request asked for none
    prompt_logprobs: list[tuple[Sequence, int, ScoredRows]]  # (sequence, first scored position, its rows)


def cpu_packing_enabled(config: EngineConfig, dtype: torch.dtype) -> bool:
    """Whether the CPU base GEMMs run on oneDNN-packed weights (``EngineConfig.cpu_weight_packing``)."""
    return config.cpu_weight_packing and onednn_packing_available(dtype)


def kv_bytes_per_block(spec: ModelSpec, block_size: int, dtype: torch.dtype) -> int:
    return 2 * spec.num_layers * block_size * spec.kv_size * torch.empty((), dtype=dtype).element_size()


class ModelRunner:
    """The model, its KV cache and its LoRA slots on one device."""

    def __init__(
        self,
        config: EngineConfig,
        spec: ModelSpec,
        weights: ModelWeights,
        num_kv_blocks: int,
        device: torch.device,
        dtype: torch.dtype,
        plan: LoRAPlan,
        quant_plan: QuantPlan | None = None,
    ) -> None:
        self.config = config
        self.spec = spec
        self.device = device
        self.dtype = dtype
        # seconds of each start-up phase (load_on_device adds the model's load before them)
        self.startup_seconds: dict[str, float] = {}
        started = time.perf_counter()
        dora_base = BaseProjection(base_row_norms(weights), self._project_base)  # before any repacking
        if device.type == "cpu" and cpu_packing_enabled(config, dtype) and not plan.shrink_in_gemm:
            pack_for_onednn(weights)  # in place: ~1.7x faster decode GEMMs on the CPU
        self.weights = weights
        # With the shrink in GEMM the slots' A factors are extra rows of the base GEMM weights.
        table_bytes = int(config.token_table_memory_gb * (1 << 30))
        self.lora = LoRASlotWeights(
            spec,
            config.max_loras,
            config.max_lora_rank,
            dtype,
            device,
            weights.shrink_in_gemm_weights,
            dora_base,
            TokenTablePool(config.max_token_tables, table_bytes, device),
        )
        max_positions = max(config.max_model_len, 16)
        self.model = LlamaModel(spec, weights, self.lora, max_positions, plan, quant_plan)
        self.block_size = config.block_size
        self.score_chunk_rows = score_chunk_rows(spec.vocab_size, dtype)
        self.max_blocks_per_seq = -(-config.max_model_len // config.block_size)
        self.num_kv_blocks = num_kv_blocks
        self._allocate_kv_cache()
        self.lora_batch = LoRABatch.allocate(config.max_num_batched_tokens, config.max_loras, device)
        self.parking = DeviceParking(device, copy_kept=device.type == "cuda")  # BasePool's swaps
        self.decode_graphs: StepGraphs | None = None
        self.mixed_graphs: StepGraphs | None = None
        started = self._phase_done("slots and KV cache", started)
        self.uses_graphs = device.type == "cuda" and not config.enforce_eager
        if self.uses_graphs:
            self._make_graphs(capture=True, started=started)
            started = time.perf_counter()
        if device.type == "cuda":
            # Triton compiles now, not in the middle of serving
            steps = warmup_steps(config, decode_graphs=self.decode_graphs is not None)
            warm_up_kernels(self.model, self.kv_caches, self.lora, config.max_num_batched_tokens, steps)
        elif dtype == torch.float32:
            # the CPU kernels compile now (or load Numba's cached build), not in the first step
            lora_cpu.compile_now()
            fused_ops_cpu.compile_now()
            paged_attention_cpu.compile_now()
        elif plan.batch_invariant:
            paged_attention_cpu.compile_now()  # the invariant attention runs every dtype in float32
        self._phase_done("kernel warm-up", started)

    def _allocate_kv_cache(self) -> None:
        spec, config = self.spec, self.config
        # KV cache: [layers, 2 (k, v), blocks, block_size, kv_heads, head_dim]
        self.kv_cache = torch.zeros(
            (spec.num_layers, 2, self.num_kv_blocks, config.block_size, spec.num_kv_heads, spec.head_dim),
            dtype=self.dtype,
            device=self.device,
        )
        self.kv_caches = [(self.kv_cache[i, 0], self.kv_cache[i, 1]) for i in range(spec.num_layers)]

    def _make_graphs(self, capture: bool, started: float = 0.0) -> None:
        """The decode and mixed steps' graphs over fresh staging buffers and one new memory pool:
        each captured now (``capture``: the start) or on the first step that needs it (after an
        unpark, so that the swap-in copies weights only)."""
        pool = torch.cuda.graph_pool_handle()  # one memory pool for every capture
        seqs = self.config.max_num_seqs
        self.decode_graphs = StepGraphs(
            self.model, self.kv_caches, self._staging(seqs, seqs, True), batch_buckets(seqs), pool, capture
        )
        if capture:
            started = self._phase_done("decode graphs", started)
        buckets = token_buckets(min(MIXED_MAX_TOKENS, self.config.max_num_batched_tokens))
        staging = self._staging(buckets[-1], seqs, False)
        self.mixed_graphs = StepGraphs(self.model, self.kv_caches, staging, buckets, pool, capture)
        if capture:
            self._phase_done("mixed graphs", started)

    # ---------------------------------------------------------------- parking (BasePool's swaps)

    def _kept_on_park(self) -> list[torch.Tensor]:
        """The tensors a park copies to host memory: the base weights and the LoRA slots."""
        return list(tensors_of(self.weights, *self.lora.device_state()))

    def park_bytes(self) -> int:
        """Host bytes a park holds: the base weights' and the LoRA slots' (each storage once)."""
        return self.parking.kept_bytes(self._kept_on_park())

    def park(self) -> None:
        """Move the weights and slots to host memory and free them, the KV cache and the graphs
        on the device (no request runs: no block is in use; ``unpark`` brings them back)."""
        self.parking.park(self._kept_on_park())
        self.decode_graphs = self.mixed_graphs = None  # their addresses are gone
        self.kv_caches = []
        self.kv_cache = torch.empty(0, dtype=self.dtype, device=self.device)  # [0]: freed
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # back to the driver: another engine's allocations see it free

    def unpark(self) -> None:
        """The weights and slots back on the device, a new KV cache of the same blocks (zeroed,
        as at the start), and graphs again (captured as steps need them)."""
        self.parking.unpark()
        self._allocate_kv_cache()
        if self.uses_graphs:
            self._make_graphs(capture=False)

    def _phase_done(self, phase: str, started: float) -> float:
        """Record ``phase`` as ending now (CUDA work included); returns now."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.startup_seconds[phase] = now - started
        return now

    def _staging(self, max_tokens: int, max_seqs: int, one_token_per_seq: bool) -> StepStaging:
        return StepStaging(
            max_tokens,
            max_seqs,
            self.max_blocks_per_seq,
            self.lora.num_slots,
            self.block_size,
            self.device,
            one_token_per_seq,
        )

    def prepare(
        self, plan: StepPlan, blocks: BlockManager, slot_of: dict[str | None, int]
    ) -> StepInputs | GraphStep:
        """Flatten the plan's chunks into the step's token, position and cache-slot arrays.

        Steps that a captured graph can run (decode steps, and steps with prompt tokens up to
        the mixed graphs' largest bucket) go to its staging buffers instead.
        """
        scores_prompt = any(
            c.seq.prompt_positions_to_score(c.start, c.start + c.num_tokens) for c in plan.chunks
        )
        uses_rows = self._uses_row_terms(plan, slot_of)
        slot_span = self._slot_span(plan, slot_of)
        tables = self.lora.token_tables.tables
        uses_tables = bool(tables) and any(slot_of.get(c.seq.adapter, -1) in tables for c in plan.chunks)
        token_tables = self._token_table_step(plan, slot_of) if uses_tables else None
        for graphs in (self.decode_graphs, self.mixed_graphs):
            if graphs is not None and not scores_prompt and graphs.accepts(plan):
                if uses_rows:
                    self.lora.ensure_row_buffers()  # the graphs read every group's rows
                return graphs.stage(
                    plan, slot_of, self.lora.slot_ranks_host, uses_rows, token_tables, slot_span
                )
        input_ids: list[int] = []
        positions: list[int] = []
        slot_mapping: list[int] = []
        slot_ids: list[int] = []
        token_scales: list[float] = []
        scaled = False  # whether some token's adapter strength is not 1.0
        seq_lens: list[int] = []
        query_start = [0]
        block_tables: list[list[int]] = []
        logits_rows: list[int] = []
        groups: set[str] = set()
        row_groups: set[str] = set()
        score_rows: list[int] = []
        score_targets: list[int] = []
        score_groups: list[tuple[Sequence, int, int]] = []
        for chunk in plan.chunks:
            seq = chunk.seq
            end = chunk.start + chunk.num_tokens
            input_ids.extend(seq.token_slice(chunk.start, end))
            span = range(chunk.start, end)
            positions.extend(span)
            slot_mapping.extend(blocks.slot_of(seq, p) for p in span)
            slot = slot_of.get(seq.adapter, -1)
            slot_ids.extend([slot] * chunk.num_tokens)
            strength = seq.params.adapter_scale if slot >= 0 else 1.0
            token_scales.extend([strength] * chunk.num_tokens)
            scaled = scaled or strength != 1.0
            if slot >= 0:
                groups |= self.lora.slot_groups[slot]
                row_groups |= self.lora.slot_row_groups[slot]
            seq_lens.append(end)
            scored = seq.prompt_positions_to_score(chunk.start, end)
            if scored:
                score_rows.extend(query_start[-1] + p - chunk.start for p in scored)
                score_targets.extend(seq.prompt_token_ids[scored.start + 1 : scored.stop + 1])
                score_groups.append((seq, scored.start, len(scored)))
            query_start.append(query_start[-1] + chunk.num_tokens)
            block_tables.append(seq.block_table)
            if chunk.completes:
                logits_rows.append(query_start[-1] - 1)
        width = max(len(t) for t in block_tables)
        padded = [t + [0] * (width - len(t)) for t in block_tables]

        def on_device(values: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype).to(self.device, non_blocking=True)

        attn = AttentionMetadata(
            slot_mapping=on_device(slot_mapping, torch.int64),
            block_tables=on_device(padded, torch.int32),
            seq_lens=on_device(seq_lens, torch.int32),
            query_start_loc=on_device(query_start, torch.int32),
            max_query_len=max(chunk.num_tokens for chunk in plan.chunks),
        )
        scoring = None
        if score_groups:
            scoring = PromptScoring(
                rows=on_device(score_rows, torch.int64),
                targets=on_device(score_targets, torch.int64),
                top_k=max(seq.params.prompt_logprobs or 0 for seq, _, _ in score_groups),
                groups=score_groups,
            )
        return StepInputs(
            input_ids=on_device(input_ids, torch.int64),
            positions=on_device(positions, torch.int64),
            attn=attn,
            slot_ids=on_device(slot_ids, torch.int32),
            token_scales=on_device(token_scales, torch.float32) if scaled else None,
            logits_rows=on_device(logits_rows, torch.int64),
            lora_groups=frozenset(groups),
            scoring=scoring,
            row_groups=frozenset(row_groups),
            tokens=token_tables,
            slot_span=slot_span,
        )

    def _token_table_step(self, plan: StepPlan, slot_of: dict[str | None, int]) -> TokenTableStep:
        """What the step's adapters with token tables need: for the tokens (embedding), the
        sampled rows and the scored prompt rows (logits), the rows of each whole matrix and
        every row's slot for the retrained-row swaps."""
        pool = self.lora.token_tables
        slots: dict[str, list[int]] = {"embed": [], "head": [], "scored": []}  # each row's slot
        whole: dict[str, dict[int, list[int]]] = {"embed": {}, "head": {}, "scored": {}}  # slot -> rows
        for chunk in plan.chunks:
            seq, slot = chunk.seq, slot_of.get(chunk.seq.adapter, -1)
            scored = len(seq.prompt_positions_to_score(chunk.start, chunk.start + chunk.num_tokens))
            rows = {
                "embed": range(len(slots["embed"]), len(slots["embed"]) + chunk.num_tokens),
                "head": range(len(slots["head"]), len(slots["head"]) + int(chunk.completes)),
                "scored": range(len(slots["scored"]), len(slots["scored"]) + scored),
            }
            for key, span in rows.items():
                slots[key].extend([slot] * len(span))
                if pool.whole("embed" if key == "embed" else "head", slot) is not None:
                    whole[key].setdefault(slot, []).extend(span)
        used = [pool.tables[s] for s in {*slots["embed"]} if s in pool.tables]

        def on_device(values: list[int], dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype).to(self.device, non_blocking=True)

        def rows_of(key: str) -> VocabRows:
            side = "embed" if key == "embed" else "head"
            swaps = pool.embed_swaps if side == "embed" else pool.head_swaps
            has_swaps = any(getattr(t, f"{side}_ids") is not None for t in used)
            matrices = []
            for slot, rows in whole[key].items():
                matrix = pool.whole(side, slot)
                assert matrix is not None  # rows are listed only for slots with the matrix
                matrices.append((on_device(rows, torch.int64), matrix))
            return VocabRows(matrices, on_device(slots[key], torch.int32), swaps if has_swaps else None)

        width = max(self.spec.vocab_size, *(t.vocab_size for t in used))
        return TokenTableStep(width, rows_of("embed"), rows_of("head"), rows_of("scored"))

    def _project_base(self, group: str, layer: int, x: torch.Tensor) -> torch.Tensor:
        """``x @ W^T`` of layer ``layer``'s ``group`` base weight (DoRA's norms)."""
        return self.model.linear(x, getattr(self.weights.layers[layer], group))

    def _slot_span(self, plan: StepPlan, slot_of: dict[str | None, int]) -> int:
        """The leading slots whose A rows the step's shrink in GEMM multiplies (0: none used):
        a batch of few adapters in the first slots does not pay for every slot's rows."""
        highest = max(slot_of.get(chunk.seq.adapter, -1) for chunk in plan.chunks)
        return 0 if highest < 0 or not self.model.plan.shrink_in_gemm else self.lora.slot_span(highest)

    def _uses_row_terms(self, plan: StepPlan, slot_of: dict[str | None, int]) -> bool:
        """Whether a sequence of the plan has a DoRA or lora_bias adapter."""
        slots = (slot_of.get(chunk.seq.adapter, -1) for chunk in plan.chunks)
        return any(self.lora.slot_row_groups[slot] for slot in slots if slot >= 0)

    @torch.inference_mode()
    def run(self, inputs: StepInputs | GraphStep) -> tuple[torch.Tensor, ScoredRows | None]:
        """Logits [N, V] float32 of the rows that sample this step, and the prompt rows' scores if asked."""
        if isinstance(inputs, GraphStep):
            return inputs.graphs.run(inputs.staged, inputs.uses_rows, inputs.tokens, inputs.slot_span), None
        lora = None
        if inputs.lora_groups:
            batch = self.lora_batch.update(inputs.slot_ids, self.lora.slot_ranks, inputs.token_scales)
            lora = LoRAStep(batch, inputs.lora_groups, inputs.row_groups, inputs.slot_span)
        tokens = inputs.tokens
        embeddings = None if tokens is None else self.model.embed(inputs.input_ids, tokens.embed)
        hidden = self.model.forward(
            inputs.input_ids, inputs.positions, inputs.attn, self.kv_caches, lora, embeddings
        )  # [T, H]
        scoring = inputs.scoring
        prompt_scores = None
        if scoring is not None:

            def scored_logits(rows: torch.Tensor, begin: int) -> torch.Tensor:  # [r, V]
                if tokens is None:
                    return self.model.head_logits(rows)
                scored = tokens.scored.within(begin, begin + rows.shape[0])
                return self.model.head_logits(rows, scored, tokens.width)

            prompt_scores = score_hidden_rows(
                scored_logits, hidden[scoring.rows], scoring.targets, scoring.top_k, self.score_chunk_rows
            )
        sampled = hidden[inputs.logits_rows]  # [N, H]
        if tokens is None:
            return self.model.logits(sampled), prompt_scores
        return self.model.logits(sampled, tokens.head, tokens.width), prompt_scores

    @torch.inference_mode()
    def sample(
        self,
        logits: torch.Tensor,
        prompt_scores: ScoredRows | None,
        scoring: PromptScoring | None,
        batch: SamplingBatch,
    ) -> StepOutput:
        """Sample each of ``batch``'s rows (after the logits processors, within its grammar's
        mask), score the rows that asked, and bring it all to the host with one wait.

        Log-probabilities are scored from the raw ``logits``. When no row asks for them, the
        processors update ``logits`` in place (nothing reads it after this step; under CUDA graphs
        it is the graph's output buffer, which the next replay overwrites).
        """
        params = [row.params for row in batch.rows]
        wanted = [row for row, p in enumerate(params) if p.logprobs is not None]
        processed = apply_processors(logits, batch, in_place=not wanted)  # [N, V]
        masks = batch.masks
        allowed = apply_token_masks(processed, masks) if masks is not None else processed  # [N, V]
        tokens = sample(allowed, batch)  # [N] on the device
        scores = None
        if wanted:
            k = max(params[row].logprobs or 0 for row in wanted)
            if len(wanted) == len(params):
                scores = score_rows(logits, tokens, k)
            else:
                index = torch.tensor(wanted).to(logits.device, non_blocking=True)
                scores = score_rows(logits[index], tokens[index], k)
        host_tokens = to_host(tokens)
        host_scores = scores.to_host() if scores is not None else None
        host_prompt = prompt_scores.to_host() if prompt_scores is not None else None
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()  # the step's one wait
        token_list = host_tokens.tolist()
        logprobs: list[TokenLogprob | None] = [None] * len(params)
        if host_scores is not None:
            entries = host_scores.entries(
                [params[r].logprobs or 0 for r in wanted], [token_list[r] for r in wanted]
            )
            for row, entry in zip(wanted, entries, strict=True):
                logprobs[row] = entry
        return StepOutput(token_list, logprobs, prompt_entries(host_prompt, scoring))


def prompt_entries(
    scores: ScoredRows | None, scoring: PromptScoring | None
) -> list[tuple[Sequence, int, ScoredRows]]:
    """The prompt rows' scores (host) split by sequence: (sequence, first scored position, its rows)."""
    if scores is None or scoring is None:
        return []
    result = []
    begin = 0
    for seq, first, count in scoring.groups:
        result.append((seq, first, scores.rows(slice(begin, begin + count))))
        begin += count
    return result
