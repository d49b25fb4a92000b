"""Continuous batching: which sequences run in the next step, and how many tokens each.

Plain Python. Each step first advances running sequences (a decode token, or the
next chunk of a prompt), preempting the newest ones by recompute when KV blocks
run out, then admits waiting sequences while the token budget, ``max_num_seqs``,
free KV blocks and adapter slots allow. A waiting sequence whose adapter is not
on the device yet is skipped, so it does not hold up the requests behind it. Only
refusals for want of a free GPU slot count towards starvation: once a sequence has
been refused a slot ``starvation_steps`` times, nothing behind it is admitted until
it is, so slots drain for it and every adapter eventually runs. Waiting for a load
(disk to host RAM, host RAM to the slot) never counts: the slot contention it would
relieve is not the reason it waits, and holding the queue would leave the batch
half empty while loads are in flight. A step looks at most ``max_skipped`` waiting
sequences past the ones it admits, which bounds its cost and the adapters it asks to
load ahead of time.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from multilora_studio.engine.batch.block_manager import BlockManager
from multilora_studio.engine.batch.sequence import Sequence, SequenceStatus


class Admission(enum.Enum):
    """What the adapter gate says about a waiting sequence's adapter."""

    READY = "ready"  # the adapter holds a slot for this sequence: admit it
    LOADING = "loading"  # on its way (disk -> host RAM -> slot): skip, not starving
    NO_SLOT = "no_slot"  # every slot is in use by running sequences: skip, counts as starving


AdapterGate = Callable[[str | None], Admission]


@dataclass(frozen=True)
class ScheduledChunk:
    """``num_tokens`` tokens of ``seq`` starting at position ``start`` run in this step."""

    seq: Sequence
    start: int
    num_tokens: int

    @property
    def completes(self) -> bool:
        """True when this chunk computes the sequence's last known token (a sample follows)."""
        return self.start + self.num_tokens == self.seq.num_tokens


@dataclass
class StepPlan:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(chunk.num_tokens for chunk in self.chunks)


class Scheduler:
    """Orders waiting and running sequences; owns neither tensors nor threads."""

    def __init__(
        self,
        blocks: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        acquire_adapter: AdapterGate,
        release_adapter: Callable[[str | None], None],
        starvation_steps: int = 32,
        max_skipped: int = 128,
    ) -> None:
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.acquire_adapter = acquire_adapter
        self.release_adapter = release_adapter
        self.starvation_steps = starvation_steps
        self.max_skipped = max_skipped  # waiting sequences skipped per step before admission stops
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.skipped_steps: dict[str, int] = {}
        self.step_count = 0

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Take ``seq`` out of the queues, free its blocks and its adapter slot."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.release_adapter(seq.adapter)
        elif seq.status is SequenceStatus.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.free(seq)
        self.skipped_steps.pop(seq.request_id, None)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def preempt(self, seq: Sequence) -> None:
        """Recompute-style preemption: drop the KV, requeue at the front."""
        self.running.remove(seq)
        self.release_adapter(seq.adapter)
        self.blocks.free(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)

    def schedule(self) -> StepPlan:
        self.step_count += 1
        plan = StepPlan()
        budget = self.max_num_batched_tokens
        scheduled: set[int] = set()
        for seq in list(self.running):
            if seq.status is not SequenceStatus.RUNNING or budget == 0:
                continue
            count = min(seq.num_uncomputed_tokens, budget)
            end = seq.num_computed_tokens + count
            while not self.blocks.can_grow(seq, end):
                victim = self._newest_unscheduled(scheduled, exclude=seq) or seq
                self.preempt(victim)
                plan.preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                continue
            self.blocks.grow(seq, end)
            plan.chunks.append(ScheduledChunk(seq, seq.num_computed_tokens, count))
            scheduled.add(id(seq))
            budget -= count
        if not plan.preempted:
            self._admit(plan, budget)
        return plan

    def _newest_unscheduled(self, scheduled: set[int], exclude: Sequence) -> Sequence | None:
        for seq in reversed(self.running):
            if seq is not exclude and id(seq) not in scheduled:
                return seq
        return None

    def _admit(self, plan: StepPlan, budget: int) -> None:
        admitted: list[Sequence] = []
        skipped_now = 0
        examined = 0  # the queue's head that this looks at: the rest is not touched
        for seq in self.waiting:  # nothing below changes the queue
            examined += 1
            if budget == 0 or len(self.running) >= self.max_num_seqs or skipped_now >= self.max_skipped:
                break
            prefix = self.blocks.cached_prefix(seq)  # its computed tokens start after them
            if self.blocks.waits_for_prefix(seq, prefix):  # never counts as starving
                skipped_now += 1
                continue
            start = len(prefix) * self.blocks.block_size
            count = min(seq.num_tokens - start, budget)
            if not self.blocks.can_take(prefix, start + count):
                break
            admission = self.acquire_adapter(seq.adapter)
            if admission is not Admission.READY:
                skipped_now += 1
                if admission is Admission.NO_SLOT:  # a load in flight never counts as starving
                    skipped = self.skipped_steps.get(seq.request_id, 0) + 1
                    self.skipped_steps[seq.request_id] = skipped
                    if skipped >= self.starvation_steps:
                        break  # this one waited long enough: let slots drain for it
                continue
            self.skipped_steps.pop(seq.request_id, None)
            self.blocks.take(seq, prefix, start + count)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            admitted.append(seq)
            plan.chunks.append(ScheduledChunk(seq, seq.num_computed_tokens, count))
            budget -= count
        if admitted:  # out of the head examined; the others keep their order
            taken = {id(seq) for seq in admitted}
            head = [self.waiting.popleft() for _ in range(examined)]
            self.waiting.extendleft(reversed([seq for seq in head if id(seq) not in taken]))
