"""The engine's step loop, on the one thread that owns the device.

Each turn: handle the commands other threads posted, then schedule -> run -> postprocess
one step. Requests live here from their ``AddRequests`` to their last ``TokenDelta``.
"""

from __future__ import annotations

import logging
import os
import random
import time
from dataclasses import dataclass, field

import llguidance
import torch

from multilora_studio.engine.batch.block_manager import BlockManager
from multilora_studio.engine.batch.prefix_cache import KEY_BYTES, kv_salt
from multilora_studio.engine.batch.scheduler import Scheduler, StepPlan
from multilora_studio.engine.batch.sequence import Sequence
from multilora_studio.engine.config import EngineConfig
from multilora_studio.engine.errors import GrammarFailure
from multilora_studio.engine.loop.commands import (
    AbortRequest,
    AddRequests,
    CallOnWorker,
    Command,
    CommandQueue,
    Park,
    PinAdapter,
    RemoveAdapter,
    Shutdown,
    SnapshotMetrics,
    Unpark,
)
from multilora_studio.engine.loop.metrics_publisher import MetricsPublisher
from multilora_studio.engine.loop.requests import RequestStream
from multilora_studio.engine.model.model_source import BaseModel
from multilora_studio.engine.outputs import TokenDelta, TokenLogprob
from multilora_studio.engine.residency.adapter_catalog import ThreadSafeAdapterCatalog
from multilora_studio.engine.residency.tier_manager import WorkerTierManager
from multilora_studio.engine.sampling.batch_sampling import SampledBatch, sample_batch
from multilora_studio.engine.sampling.grammar import DeviceMasks, GrammarCompiler, TokenMasks, advance
from multilora_studio.engine.sampling.logprobs import PromptScores, ScoredRows
from multilora_studio.engine.sampling.sampler import make_generator
from multilora_studio.engine.sampling.sampling_batch import SamplingBatch, SamplingRow
from multilora_studio.engine.step.runner import ModelRunner
from multilora_studio.engine.step.step_graphs import GraphStep
from multilora_studio.engine.step.step_inputs import PromptScoring, StepInputs
from multilora_studio.engine.step.step_trace import StepRecord, StepTrace
from multilora_studio.engine.text.detokenizer import IncrementalDetokenizer

log = logging.getLogger(__name__)

PHASES = ("schedule", "prepare", "launch", "sample", "postprocess")


@dataclass
class ActiveRequest:
    """Worker-side state of one request."""

    seq: Sequence
    stream: RequestStream
    detok: IncrementalDetokenizer | None
    sampling: SamplingRow  # its parameters, random stream and tokens, for the steps that sample it
    # the request's grammar state (``SamplingParams.structured``): it has consumed every output token
    matcher: llguidance.LLMatcher | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per generated token, if asked
    prompt_scores: list[ScoredRows] = field(default_factory=list)  # host rows of prompt positions, if asked
    prompt_logprobs_sent: PromptScores | None = None  # what a delta carried, once it has


class EngineWorker:
    """Runs the steps of one engine; every method runs on the worker thread."""

    def __init__(
        self,
        config: EngineConfig,
        base: BaseModel,
        runner: ModelRunner,
        blocks: BlockManager,
        catalog: ThreadSafeAdapterCatalog,
        tiers: WorkerTierManager,
        commands: CommandQueue,
    ) -> None:
        self.config = config
        self.base = base
        self.runner = runner
        self.blocks = blocks
        self.catalog = catalog
        self.tiers = tiers
        self.commands = commands
        self.scheduler = Scheduler(
            blocks, config.max_num_seqs, config.max_num_batched_tokens, tiers.acquire, tiers.release
        )
        self.metrics = MetricsPublisher(runner.device, self.scheduler, blocks, tiers)
        self.step_trace = StepTrace()  # the recent steps, for benchmarks and diagnosis
        # Cumulative seconds per phase of the steps, and the step count ("steps"). ``launch`` is
        # host time to enqueue the forward pass; on CUDA the device time shows up in ``sample``,
        # which waits for the logits.
        self.phase_seconds = dict.fromkeys((*PHASES, "steps"), 0.0)
        # structured output: grammars for the model's tokenizer (the engine compiles at submit)
        self.grammars = GrammarCompiler(base.tokenizer, base.spec.eos_token_ids)
        self._token_masks: TokenMasks | None = None  # built by the first step with a grammar
        self._seeds = random.Random(config.seed)  # each request's sampling seed, unless it sets one
        self._active: dict[str, ActiveRequest] = {}
        self._last_step_end = 0.0
        self.cpu_threads = torch.get_num_threads()  # torch's threads for the steps (built on this thread)
        # swapped out (``park``): no step, upload or pinned load runs until ``unpark``
        self.parked = False
        # what makes this engine's base KV what it is, for the prefix cache's keys
        self._base_salt = kv_salt(base.digest, str(runner.dtype), config.quantization, config.batch_invariant)

    # ---------------------------------------------------------------- the loop

    def run(self) -> None:
        """Until a ``Shutdown``: commands, then schedule -> run -> postprocess."""
        wake = self.commands.wake
        while True:
            wake.clear()
            if not self._drain_commands():
                return
            if self.parked:  # requests queued meanwhile wait for the swap-in
                wake.wait()
                continue
            self._fail_unloadable_adapters()
            self.tiers.look_ahead()
            pinned_loading = self.tiers.load_pinned()
            if not self.scheduler.has_work:
                self.metrics.publish(force=True)
                # a pinned adapter on its way into a slot is checked again soon (the loader wakes us)
                wake.wait(0.05 if pinned_loading else None)
                continue
            started = time.perf_counter()
            plan = self.scheduler.schedule()
            scheduled = self._tick("schedule", started)
            self.metrics.preemptions += len(plan.preempted)
            if not plan.chunks:
                # waiting for an adapter to arrive from disk (the loader wakes us) or to upload
                wake.wait(0.002 if self.tiers.uploads_in_flight else 0.05)
                continue
            self._step(plan, started, scheduled)

    def _step(self, plan: StepPlan, scheduling_started: float, scheduled: float) -> None:
        self._mark_scheduled(plan)
        try:
            slot_of = self._slots_of(plan)
            t_prepare = time.perf_counter()
            inputs = self.runner.prepare(plan, self.blocks, slot_of)
            t_launch = self._tick("prepare", t_prepare)
            logits, prompt_scores = self.runner.run(inputs)
            t_sample = self._tick("launch", t_launch)
            sampling = [self._active[c.seq.request_id] for c in plan.chunks if c.completes]
            masks = self._fill_masks(sampling)  # on the host while the device runs the step
            batch = SamplingBatch([a.sampling for a in sampling], masks)
            output = sample_batch(logits, batch, prompt_scores)  # on the host: the step's one wait
            t_post = self._tick("sample", t_sample)
            self._bill(plan, t_post - scheduling_started)
        except Exception as error:
            log.exception("step failed")
            for chunk in plan.chunks:
                self._finish(chunk.seq.request_id, "error", f"engine step failed: {error}")
            return
        scoring = inputs.scoring if isinstance(inputs, StepInputs) else None
        self._postprocess(plan, sampling, output, scoring)
        end = self._tick("postprocess", t_post)
        self.phase_seconds["steps"] += 1
        self.step_trace.record(
            StepRecord(
                start=t_prepare,
                schedule_s=scheduled - scheduling_started,
                gap_s=max(0.0, scheduling_started - self._last_step_end),
                prepare_s=t_launch - t_prepare,
                launch_s=t_sample - t_launch,
                sample_s=t_post - t_sample,
                post_s=end - t_post,
                tokens=plan.num_tokens,
                sequences=len(plan.chunks),
                prompt_tokens=sum(c.num_tokens for c in plan.chunks if c.num_tokens > 1),
                lora_sequences=sum(c.seq.adapter is not None for c in plan.chunks),
                graph=isinstance(inputs, GraphStep),
                uploads_in_flight=self.tiers.uploads_in_flight,
            )
        )
        self._last_step_end = end

    def _bill(self, plan: StepPlan, seconds: float) -> None:
        """Split a step's ``seconds`` over its requests by their tokens (before any of them is
        finished, so a final output carries its whole share)."""
        self.metrics.busy_seconds += seconds
        per_token = seconds / plan.num_tokens
        for chunk in plan.chunks:
            self._active[chunk.seq.request_id].stream.output.engine_seconds += per_token * chunk.num_tokens

    def _fill_masks(self, sampling: list[ActiveRequest]) -> DeviceMasks | None:
        """The token masks of the sampling rows under a grammar; None when no row has one."""
        rows = [
            (row, active.matcher)
            for row, active in enumerate(sampling)
            if active.matcher is not None and active.seq.params.max_tokens > 0
        ]
        if not rows:
            return None
        if self._token_masks is None:
            self._token_masks = TokenMasks(
                self.grammars.vocab_size, self.config.max_num_seqs, self.runner.device
            )
        return self._token_masks.fill(rows)

    def _mark_scheduled(self, plan: StepPlan) -> None:
        """Record when each request of ``plan`` first ran (its queue time ends there)."""
        now = time.monotonic()
        for chunk in plan.chunks:
            output = self._active[chunk.seq.request_id].stream.output
            if output.first_scheduled_time is None:
                output.first_scheduled_time = now
                output.num_cached_tokens = chunk.seq.num_cached_tokens or 0

    def _slots_of(self, plan: StepPlan) -> dict[str | None, int]:
        """The GPU slot of each adapter in ``plan`` (None: -1, the base model)."""
        slot_of: dict[str | None, int] = {None: -1}
        for chunk in plan.chunks:
            name = chunk.seq.adapter
            if name is not None and name not in slot_of:
                slot = self.tiers.slots.slot_of(name)
                if slot is None:
                    raise RuntimeError(f"adapter {name} lost its slot while running")
                slot_of[name] = slot
        return slot_of

    def _postprocess(
        self,
        plan: StepPlan,
        sampling: list[ActiveRequest],
        output: SampledBatch,
        scoring: PromptScoring | None,
    ) -> None:
        for chunk in plan.chunks:
            chunk.seq.num_computed_tokens += chunk.num_tokens
            self.blocks.index_computed(chunk.seq)
        scores = output.prompt_scores
        scored = scoring.split(scores) if scoring is not None and scores is not None else []
        for seq, first, rows in scored:
            active = self._active.get(seq.request_id)
            if active is not None and first == seq.scored_prompt_positions:
                active.prompt_scores.append(rows)
                seq.scored_prompt_positions += len(rows.packed)
        now = time.monotonic()
        for active, token, logprob in zip(sampling, output.tokens, output.logprobs, strict=True):
            if active.seq.params.max_tokens == 0:  # the prompt only: its sampled token is dropped
                self._finish(active.seq.request_id, "length", None)
            else:
                self._append_token(active, token, logprob, now)
        self.metrics.record_step(plan, len(output.tokens), now)
        self.metrics.publish()

    def _tick(self, phase: str, since: float) -> float:
        now = time.perf_counter()
        self.phase_seconds[phase] += now - since
        return now

    # ---------------------------------------------------------------- requests

    def _append_token(
        self, active: ActiveRequest, token: int, logprob: TokenLogprob | None, now: float
    ) -> None:
        seq, output = active.seq, active.stream.output
        seq.output_token_ids.append(token)
        if logprob is not None:
            active.logprobs.append(logprob)
        if output.first_token_time is None:
            output.first_token_time = now
        params = seq.params
        reason = None
        stopped_by_text = active.detok.add(token) if active.detok is not None else False  # after min_tokens
        new_logprobs = (logprob,) if logprob is not None else ()
        try:
            grammar_done = active.matcher is not None and advance(active.matcher, token)
        except GrammarFailure as error:  # the grammar refused a token it allowed: this request only
            log.error("request %s: %s", seq.request_id, error)
            self._finish(seq.request_id, "error", error, pending=[token], pending_logprobs=new_logprobs)
            return
        if (
            stopped_by_text
            or grammar_done
            or token in params.stop_token_ids
            or (not params.ignore_eos and token in seq.eos_token_ids)
        ):
            reason = "stop"
        elif len(seq.output_token_ids) >= params.max_tokens or seq.num_tokens >= self.config.max_model_len:
            reason = "length"
        if reason is not None:
            self._finish(seq.request_id, reason, None, pending=[token], pending_logprobs=new_logprobs)
        else:
            text = active.detok.delta(finished=False) if active.detok is not None else ""
            prompt = self._prompt_logprobs_once(active)
            active.stream.push(
                TokenDelta(seq.request_id, [token], text, logprobs=new_logprobs, prompt_logprobs=prompt)
            )

    @staticmethod
    def _prompt_scores(active: ActiveRequest) -> PromptScores:
        """The prompt's log-probabilities as scored so far (None for position 0)."""
        seq = active.seq
        unscored = seq.first_scored_position
        targets = seq.prompt_token_ids[1 + unscored : 1 + seq.scored_prompt_positions]
        return PromptScores(active.prompt_scores, targets, seq.params.prompt_logprobs or 0, unscored)

    def _prompt_logprobs_once(self, active: ActiveRequest) -> PromptScores | None:
        """The prompt's log-probabilities on the first delta that carries a token (or the last)."""
        if active.seq.params.prompt_logprobs is None or active.prompt_logprobs_sent is not None:
            return None
        active.prompt_logprobs_sent = self._prompt_scores(active)
        return active.prompt_logprobs_sent

    def _finish(
        self,
        request_id: str,
        reason: str,
        error: str | Exception | None,
        pending: list[int] | None = None,
        pending_logprobs: tuple[TokenLogprob, ...] = (),
    ) -> None:
        active = self._active.pop(request_id, None)
        if active is None:
            return
        self.tiers.unwant(active.seq.adapter)
        seq, output = active.seq, active.stream.output
        if not seq.is_finished:
            self.scheduler.finish(seq, reason)
        text = active.detok.delta(finished=True) if active.detok is not None else ""
        output.token_ids = list(seq.output_token_ids)
        output.text = active.detok.text if active.detok is not None else ""
        error_type = type(error) if isinstance(error, Exception) else None
        message = str(error) if error is not None else None
        output.finish_reason, output.error, output.error_type = reason, message, error_type
        output.finish_time = time.monotonic()
        params = seq.params
        if params.logprobs is not None:
            output.logprobs = list(active.logprobs)
        prompt = self._prompt_logprobs_once(active)
        if params.prompt_logprobs is not None:
            output.prompt_logprobs = active.prompt_logprobs_sent
        active.stream.push(
            TokenDelta(
                request_id, pending or [], text, True, reason, message, pending_logprobs, prompt, error_type
            )
        )

    def _add(self, requests: list[tuple[Sequence, RequestStream]]) -> None:
        device = self.runner.device
        for seq, stream in requests:
            seq.arrival_step = self.scheduler.step_count
            own = self.catalog.tokenizer_of(seq.adapter)
            tokenizer = own.tokenizer if own is not None else self.base.tokenizer
            detok = (
                IncrementalDetokenizer(tokenizer, tuple(seq.params.stop), seq.params.min_tokens)
                if tokenizer
                else None
            )
            generator = make_generator(seq.params, device, self._seeds.getrandbits(63))
            sampling = SamplingRow(
                seq.params, generator, seq.prompt_token_ids, seq.output_token_ids, seq.eos_token_ids
            )
            active = ActiveRequest(seq, stream, detok, sampling)
            self._salt(seq)
            self._active[seq.request_id] = active
            stream.output.adapter_tier = self.tiers.tier_of(seq.adapter)
            self.tiers.want(seq.adapter)
            self.scheduler.add(seq)
            if seq.adapter is not None:
                self._fail_if_unloadable(seq.request_id, seq.adapter)
            if seq.params.structured is not None:
                try:
                    active.matcher = self.grammars.matcher(seq.params.structured)
                except ValueError as error:  # compiled at submit; only a failed recompile lands here
                    self._finish(seq.request_id, "error", str(error))

    def _salt(self, seq: Sequence) -> None:
        """Key ``seq``'s KV blocks by the base and its cache salt, and by its adapter's version and
        strength."""
        salt = seq.params.cache_salt
        seq.base_salt = seq.kv_salt = self._base_salt if salt is None else kv_salt(self._base_salt, salt)
        if seq.adapter is not None:
            info = self.catalog.info_of(seq.adapter)
            if info is None:  # removed meanwhile (the request fails): its KV matches nothing
                seq.kv_salt = os.urandom(KEY_BYTES)
                return
            seq.adapter_version = info.version
            seq.kv_salt = kv_salt(seq.base_salt, info.version, seq.params.adapter_scale)

    def _fail_unloadable_adapters(self) -> None:
        """Fail the waiting requests of each adapter whose load failed since the last step: the
        requests are looked at only when a load failed, so a deep queue costs no step anything
        (a request that arrives while the failure holds is failed in ``_add``)."""
        failed = set(self.tiers.take_failed_loads())
        if not failed:
            return
        for request_id, active in list(self._active.items()):
            name = active.seq.adapter
            if name in failed and active.seq.status.value == "waiting":
                self._fail_if_unloadable(request_id, name)

    def _fail_if_unloadable(self, request_id: str, name: str) -> None:
        error = self.tiers.load_error(name)
        if error is not None:
            self._finish(request_id, "error", f"adapter {name!r} could not be loaded: {error}")

    # ---------------------------------------------------------------- commands

    def _drain_commands(self) -> bool:
        """Handle every posted command; False once a ``Shutdown`` came."""
        while (item := self.commands.take()) is not None:
            command, future = item
            if isinstance(command, Shutdown):
                for request_id in list(self._active):
                    self._finish(request_id, "abort", "the engine was shut down")
                return False
            try:
                result = self._handle(command)
            except Exception as error:
                if future is None:
                    log.exception("command %s failed", type(command).__name__)
                else:
                    future.set_exception(error)
            else:
                if future is not None:
                    future.set_result(result)
        return True

    def _handle(self, command: Command) -> object:
        if isinstance(command, AddRequests):
            self._add(command.requests)
        elif isinstance(command, AbortRequest):
            self._finish(command.request_id, "abort", None)
        elif isinstance(command, RemoveAdapter):
            self._refuse_while_parked(f"remove adapter {command.name!r}")
            version = self.catalog.require(command.name).version
            self.tiers.remove(command.name)
            self.blocks.drop_cached(version)
        elif isinstance(command, PinAdapter):
            self.tiers.pin(command.name, command.pinned)
        elif isinstance(command, SnapshotMetrics):
            self.metrics.publish(force=True)
            return self.metrics.latest
        elif isinstance(command, CallOnWorker):
            return command.work()
        elif isinstance(command, Park):
            self._park()
        elif isinstance(command, Unpark):
            self._unpark()
        else:
            raise ValueError(f"unknown engine command {command!r}")
        return None

    # ---------------------------------------------------------------- swaps (BasePool)

    def _park(self) -> None:
        """Swap the base out (``ModelRunner.park``); refused while requests are queued or running."""
        if self._active:
            running = len(self._active)
            raise RuntimeError(f"cannot swap the base out: {running} requests are queued or running")
        if self.parked:
            return
        self.tiers.finish_uploads()
        nbytes = self.runner.park_bytes()
        self.runner.park()
        self.parked = self.metrics.parked = True
        self.metrics.publish(force=True)
        log.info("base %s swapped out (%.2f GB in host memory)", self.base.name, nbytes / 1e9)

    def _unpark(self) -> None:
        if self.parked:
            self.runner.unpark()
            self.parked = self.metrics.parked = False
            self.metrics.publish(force=True)

    def _refuse_while_parked(self, what: str) -> None:
        """RuntimeError for work on the device while the base is swapped out."""
        if self.parked:
            raise RuntimeError(f"cannot {what} while the base {self.base.name} is swapped out")
