"""Runs one scheduled step's forward pass on the device: stages the step's inputs (eager, or into
a captured graph's buffers), runs the model and returns the logits of the rows that sample.

Owns every device tensor (weights, KV cache, LoRA slots); used only from the
engine's worker thread.
"""

from __future__ import annotations

import logging
import time

import torch

from multilora_studio.engine.batch.block_manager import BlockManager
from multilora_studio.engine.batch.scheduler import StepPlan
from multilora_studio.engine.config import EngineConfig
from multilora_studio.engine.model.device_model import build_device_model
from multilora_studio.engine.model.llama import LoRAStep
from multilora_studio.engine.model.model_spec import ModelSpec
from multilora_studio.engine.model.weights import ModelWeights
from multilora_studio.engine.residency.device_parking import DeviceParking, tensors_of
from multilora_studio.engine.sampling.logprobs import ScoredRows, score_chunk_rows, score_hidden_rows
from multilora_studio.engine.step.kernel_warmup import compile_cpu_kernels, warm_up_kernels, warmup_steps
from multilora_studio.engine.step.step_graphs import (
    MIXED_MAX_TOKENS,
    GraphStep,
    StepGraphs,
    batch_buckets,
    token_buckets,
)
from multilora_studio.engine.step.step_inputs import StepInputs, eager_inputs, token_table_step
from multilora_studio.engine.step.step_staging import StepStaging
from multilora_studio.kernels.lora import LoRABatch, LoRAPlan
from multilora_studio.kernels.quant_linear import QuantPlan

log = logging.getLogger(__name__)


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
        self.weights = weights
        self.model, self.lora = build_device_model(config, spec, weights, device, dtype, plan, quant_plan)
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
        # a mixture-of-experts base runs eagerly: each expert's GEMM is sized by its token count,
        # read on the host, which a captured graph cannot do (engine/model/moe.py)
        self.uses_graphs = device.type == "cuda" and not config.enforce_eager and spec.moe is None
        if self.uses_graphs:
            self._make_graphs(capture=True, started=started)
            started = time.perf_counter()
        if device.type == "cuda":
            # Triton compiles now, not in the middle of serving
            steps = warmup_steps(config, decode_graphs=self.decode_graphs is not None)
            warm_up_kernels(self.model, self.kv_caches, self.lora, config.max_num_batched_tokens, steps)
        else:
            compile_cpu_kernels(dtype, plan.batch_invariant)
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
        token_tables = (
            token_table_step(plan, slot_of, self.lora.token_tables, self.spec.vocab_size, self.device)
            if uses_tables
            else None
        )
        for graphs in (self.decode_graphs, self.mixed_graphs):
            if graphs is not None and not scores_prompt and graphs.accepts(plan):
                if uses_rows:
                    self.lora.ensure_row_buffers()  # the graphs read every group's rows
                return graphs.stage(
                    plan, slot_of, self.lora.slot_ranks_host, uses_rows, token_tables, slot_span
                )
        return eager_inputs(plan, blocks, slot_of, self.lora, self.device, token_tables, slot_span)

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
