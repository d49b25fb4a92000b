"""Continuous batching: chunked prefill, admission limits, preemption, adapter gating, starvation.

The scheduler runs over a real BlockManager and a real SlotTable; a step is simulated the
way the engine does it: every chunk's tokens become computed, and every chunk that
completes its sequence appends one (fake) sampled token.
"""

from __future__ import annotations

import random
from collections import Counter, deque

import pytest

from multilora_studio.adapters.slot_table import SlotTable
from multilora_studio.engine.batch.block_manager import BlockManager
from multilora_studio.engine.batch.scheduler import Admission, ScheduledChunk, Scheduler, StepPlan
from multilora_studio.engine.batch.sequence import Sequence, SequenceStatus
from multilora_studio.engine.sampling_params import SamplingParams

FAKE_TOKEN = 7


class Harness:
    """Scheduler + block manager + slot table, with the engine's adapter gate and step update."""

    def __init__(
        self,
        num_blocks: int = 64,
        block_size: int = 4,
        max_loras: int = 2,
        max_num_seqs: int = 8,
        max_num_batched_tokens: int = 32,
        starvation_steps: int = 32,
    ) -> None:
        self.blocks = BlockManager(num_blocks, block_size)
        self.slots = SlotTable(max_loras)
        self.acquired: Counter[str | None] = Counter()
        self.released: Counter[str | None] = Counter()
        self.scheduler = Scheduler(
            self.blocks,
            max_num_seqs,
            max_num_batched_tokens,
            self.acquire,
            self.release,
            starvation_steps,
        )
        self.loading: set[str] = set()  # adapters the gate reports as still loading
        self.counter = 0
        self.sampled: list[Sequence] = []  # sequences that got a token in the last step

    def acquire(self, name: str | None) -> Admission:
        if name in self.loading:
            return Admission.LOADING
        if name is not None and self.slots.acquire(name) is None:
            return Admission.NO_SLOT
        self.acquired[name] += 1
        return Admission.READY

    def release(self, name: str | None) -> None:
        self.released[name] += 1
        if name is not None:
            self.slots.release(name)

    def request(self, prompt_len: int, adapter: str | None = None, max_tokens: int = 4) -> Sequence:
        self.counter += 1
        seq = Sequence(
            f"req-{self.counter}",
            [(self.counter * 31 + i) % 1000 for i in range(prompt_len)],
            adapter,
            SamplingParams(max_tokens=max_tokens),
            arrival_step=self.scheduler.step_count,
        )
        self.scheduler.add(seq)
        return seq

    def step(self) -> StepPlan:
        plan = self.scheduler.schedule()
        completing = [chunk for chunk in plan.chunks if chunk.completes]
        self.sampled = [chunk.seq for chunk in completing]
        for chunk in plan.chunks:
            assert chunk.start == chunk.seq.num_computed_tokens
            chunk.seq.num_computed_tokens += chunk.num_tokens
        for chunk in completing:
            seq = chunk.seq
            seq.output_token_ids.append(FAKE_TOKEN)
            if len(seq.output_token_ids) >= seq.params.max_tokens:
                self.scheduler.finish(seq, "length")
        return plan

    def run_until_idle(self, limit: int = 10_000) -> int:
        for steps in range(1, limit + 1):
            self.step()
            if not self.scheduler.has_work:
                return steps
        raise AssertionError(f"still busy after {limit} steps")

    def owned_blocks(self) -> list[int]:
        return [block for seq in self.scheduler.running for block in seq.block_table]


def spans(plan: StepPlan) -> list[tuple[str, int, int]]:
    return [(chunk.seq.request_id, chunk.start, chunk.num_tokens) for chunk in plan.chunks]


# ---------------------------------------------------------------- plan data


def test_chunk_completes_only_when_it_reaches_the_last_known_token():
    seq = Sequence("r", [1, 2, 3, 4, 5], None, SamplingParams(), arrival_step=0)
    assert not ScheduledChunk(seq, 0, 4).completes
    assert ScheduledChunk(seq, 0, 5).completes
    assert ScheduledChunk(seq, 3, 2).completes
    seq.output_token_ids.append(9)
    assert not ScheduledChunk(seq, 3, 2).completes
    assert ScheduledChunk(seq, 5, 1).completes
    plan = StepPlan([ScheduledChunk(seq, 0, 4), ScheduledChunk(seq, 4, 2)])
    assert plan.num_tokens == 6


# ---------------------------------------------------------------- chunked prefill and budget


def test_long_prompt_is_prefilled_in_chunks_under_the_token_budget():
    h = Harness(max_num_batched_tokens=32)
    seq = h.request(100, max_tokens=2)
    plans, sampled = [], []
    for _ in range(4):
        plans.append(spans(h.step()))
        sampled.append(h.sampled)
    assert plans == [
        [(seq.request_id, 0, 32)],
        [(seq.request_id, 32, 32)],
        [(seq.request_id, 64, 32)],
        [(seq.request_id, 96, 4)],
    ]
    assert sampled == [[], [], [], [seq]]
    assert seq.output_token_ids == [FAKE_TOKEN]  # sampled only after the last prompt chunk
    assert spans(h.step()) == [(seq.request_id, 100, 1)]  # then one decode token
    assert seq.is_finished and seq.finish_reason == "length"
    assert h.blocks.num_free == h.blocks.num_blocks


def test_decodes_go_first_and_new_prompts_share_what_is_left_of_the_budget():
    h = Harness(max_num_batched_tokens=16, num_blocks=64)
    a = h.request(3, max_tokens=10)
    b = h.request(3, max_tokens=10)
    assert spans(h.step()) == [(a.request_id, 0, 3), (b.request_id, 0, 3)]
    c = h.request(40, max_tokens=3)
    plan = h.step()
    assert spans(plan) == [(a.request_id, 3, 1), (b.request_id, 3, 1), (c.request_id, 0, 14)]
    assert plan.num_tokens == 16
    plan = h.step()
    assert spans(plan) == [(a.request_id, 4, 1), (b.request_id, 4, 1), (c.request_id, 14, 14)]


def test_decodes_use_the_budget_to_its_last_token():
    h = Harness(max_num_batched_tokens=3)
    a, b, c = (h.request(1, max_tokens=3) for _ in range(3))
    assert spans(h.step()) == [(a.request_id, 0, 1), (b.request_id, 0, 1), (c.request_id, 0, 1)]
    assert spans(h.step()) == [(a.request_id, 1, 1), (b.request_id, 1, 1), (c.request_id, 1, 1)]


def test_budget_exhausted_by_prefill_leaves_later_sequences_for_the_next_step():
    h = Harness(max_num_batched_tokens=8)
    a = h.request(20)
    b = h.request(2)
    assert spans(h.step()) == [(a.request_id, 0, 8)]
    assert b.status is SequenceStatus.WAITING
    assert spans(h.step()) == [(a.request_id, 8, 8)]
    assert spans(h.step()) == [(a.request_id, 16, 4), (b.request_id, 0, 2)]


def test_max_num_seqs_limits_the_running_batch():
    h = Harness(max_num_seqs=3, max_num_batched_tokens=64)
    seqs = [h.request(2, max_tokens=3) for _ in range(5)]
    plan = h.step()
    assert [c.seq for c in plan.chunks] == seqs[:3]
    assert len(h.scheduler.running) == 3
    assert [s.status for s in seqs[3:]] == [SequenceStatus.WAITING] * 2
    h.step()
    h.step()  # the first three finish here (3 tokens each)
    assert all(s.is_finished for s in seqs[:3])
    plan = h.step()
    assert [c.seq for c in plan.chunks] == seqs[3:]


# ---------------------------------------------------------------- KV-block admission and preemption


def test_waiting_sequence_is_admitted_only_when_its_first_chunk_fits_in_free_blocks():
    h = Harness(num_blocks=4, block_size=4, max_num_batched_tokens=64)
    a = h.request(12, max_tokens=1)  # 3 blocks
    b = h.request(8, max_tokens=1)  # 2 blocks: does not fit next to a
    c = h.request(1, max_tokens=1)  # would fit, but admission is first come first served
    assert spans(h.step()) == [(a.request_id, 0, 12)]
    assert a.is_finished
    assert b.status is SequenceStatus.WAITING and c.status is SequenceStatus.WAITING
    assert spans(h.step()) == [(b.request_id, 0, 8), (c.request_id, 0, 1)]


def test_newest_running_sequence_is_preempted_by_recompute_when_blocks_run_out():
    h = Harness(num_blocks=4, block_size=2, max_num_batched_tokens=64)  # one sequence of 8 fits
    old = h.request(2, max_tokens=6)
    new = h.request(2, adapter="x", max_tokens=6)
    h.step()  # prefill: one block each
    h.step()  # position 2: a second block each, none left
    assert h.blocks.num_free == 0
    assert not h.step().preempted  # position 3 fits the second blocks
    assert h.acquired["x"] == 1 and h.released["x"] == 0
    plan = h.step()  # position 4: old needs a third block, so the newest sequence goes
    assert plan.preempted == [new]
    assert spans(plan) == [(old.request_id, 4, 1)]
    assert new.status is SequenceStatus.WAITING
    assert new.num_computed_tokens == 0 and new.block_table == [] and new.num_preemptions == 1
    assert list(h.scheduler.waiting) == [new]
    assert h.released["x"] == 1 and h.slots.in_use("x") == 0
    assert len(old.block_table) == 3 and h.blocks.num_free == 1
    assert new.output_token_ids == [FAKE_TOKEN] * 3  # kept: recomputed on re-admission
    h.run_until_idle()
    assert old.output_token_ids == [FAKE_TOKEN] * 6
    assert new.output_token_ids == [FAKE_TOKEN] * 6
    assert h.blocks.num_free == h.blocks.num_blocks
    assert h.acquired == h.released == Counter({None: 1, "x": 2})


def test_preempted_sequence_recomputes_prompt_and_outputs_then_samples_the_next_token():
    h = Harness(num_blocks=4, block_size=2, max_num_batched_tokens=64)
    old = h.request(2, max_tokens=6)
    new = h.request(2, max_tokens=6)
    while not h.step().preempted:
        pass
    assert new.num_tokens == 5 and new.num_computed_tokens == 0
    while new.status is SequenceStatus.WAITING:  # its 5 tokens need 3 blocks: waits for old
        plan = h.step()
    assert old.is_finished
    assert spans(plan) == [(new.request_id, 0, 5)]  # prompt + 3 outputs in one chunk
    assert new.output_token_ids == [FAKE_TOKEN] * 4  # and that chunk sampled a new token
    h.run_until_idle()
    assert new.output_token_ids == [FAKE_TOKEN] * 6


def test_no_admission_in_a_step_that_preempted():
    h = Harness(num_blocks=4, block_size=2, max_num_batched_tokens=64)
    h.request(2, max_tokens=6)
    h.request(2, max_tokens=6)
    for _ in range(3):
        h.step()
    late = h.request(1, max_tokens=1)  # would fit the block left over after the preemption
    plan = h.step()
    assert plan.preempted and h.blocks.num_free == 1
    assert all(c.seq is not late for c in plan.chunks)
    assert late.status is SequenceStatus.WAITING
    h.run_until_idle()
    assert late.output_token_ids == [FAKE_TOKEN]


def test_several_newest_sequences_are_preempted_newest_first_and_requeued_in_age_order():
    h = Harness(num_blocks=4, block_size=2, max_num_batched_tokens=64)
    a, b, c, d = (h.request(2, max_tokens=5) for _ in range(4))
    h.step()  # one block each, none left
    assert h.blocks.num_free == 0
    plan = h.step()  # everyone needs a second block: a takes d's, b takes c's
    assert plan.preempted == [d, c]
    assert spans(plan) == [(a.request_id, 2, 1), (b.request_id, 2, 1)]
    assert list(h.scheduler.waiting) == [c, d]
    assert h.scheduler.running == [a, b]
    h.run_until_idle()
    assert all(s.output_token_ids == [FAKE_TOKEN] * 5 for s in (a, b, c, d))


def test_a_sequence_that_cannot_grow_preempts_itself_when_only_older_ones_hold_blocks():
    h = Harness(num_blocks=3, block_size=2, max_num_batched_tokens=64)
    old = h.request(2, max_tokens=20)
    new = h.request(2, max_tokens=20)
    h.step()  # one block each, one left
    plan = h.step()  # old takes the last block; new has no newer sequence to preempt
    assert plan.preempted == [new]
    assert [c.seq for c in plan.chunks] == [old]
    assert new.status is SequenceStatus.WAITING and new.block_table == []
    assert h.blocks.num_free == 1


def test_every_preemption_of_a_sequence_is_counted():
    h = Harness()
    seq = h.request(3, max_tokens=9)
    for expected in (1, 2):
        h.step()
        assert seq.status is SequenceStatus.RUNNING
        h.scheduler.preempt(seq)
        assert seq.num_preemptions == expected and seq.num_computed_tokens == 0
    h.run_until_idle()
    assert seq.output_token_ids == [FAKE_TOKEN] * 9 and seq.num_preemptions == 2


def test_single_sequence_filling_the_whole_cache_finishes_without_preemption():
    h = Harness(num_blocks=4, block_size=4, max_num_batched_tokens=5)
    seq = h.request(10, max_tokens=6)  # 16 tokens at the end: exactly 4 blocks
    h.run_until_idle()
    assert seq.output_token_ids == [FAKE_TOKEN] * 6 and seq.num_preemptions == 0
    assert h.blocks.num_free == 4


# ---------------------------------------------------------------- adapters


def test_waiting_request_whose_adapter_has_no_slot_does_not_block_requests_behind_it():
    h = Harness(max_loras=1, max_num_batched_tokens=64)
    a = h.request(2, adapter="a", max_tokens=5)
    h.step()
    b = h.request(2, adapter="b", max_tokens=5)
    base = h.request(2, adapter=None, max_tokens=5)
    also_a = h.request(2, adapter="a", max_tokens=5)
    plan = h.step()
    assert [c.seq for c in plan.chunks] == [a, base, also_a]
    assert b.status is SequenceStatus.WAITING
    assert h.scheduler.skipped_steps[b.request_id] == 1
    h.run_until_idle()
    assert b.output_token_ids == [FAKE_TOKEN] * 5
    assert h.acquired == h.released


def test_distinct_adapters_in_the_running_batch_never_exceed_the_slots():
    h = Harness(max_loras=2, max_num_batched_tokens=64, max_num_seqs=16)
    seqs = [h.request(3, adapter=f"ad{i % 5}", max_tokens=4) for i in range(15)]
    while h.scheduler.has_work:
        h.step()
        names = {s.adapter for s in h.scheduler.running}
        assert len(names) <= 2
        for name in names:
            assert h.slots.in_use(name) == sum(s.adapter == name for s in h.scheduler.running)
    assert all(s.output_token_ids == [FAKE_TOKEN] * 4 for s in seqs)


def test_starved_request_stops_admission_behind_it_until_it_gets_a_slot():
    h = Harness(max_loras=1, max_num_seqs=4, max_num_batched_tokens=64, starvation_steps=3)
    h.request(2, adapter="hot", max_tokens=3)
    h.step()
    cold = h.request(2, adapter="cold", max_tokens=2)
    hot_admitted: list[int] = []
    skips: list[int] = []
    for _ in range(30):
        h.request(2, adapter="hot", max_tokens=3)  # an endless stream for the resident adapter
        plan = h.step()
        hot_admitted.append(sum(c.seq.adapter == "hot" and c.start == 0 for c in plan.chunks))
        skips.append(h.scheduler.skipped_steps.get(cold.request_id, 0))
        if cold.status is not SequenceStatus.WAITING:
            break
    assert cold.status is SequenceStatus.RUNNING, "the cold adapter starved"
    assert skips == [1, 2, 3, 4, 0]
    assert hot_admitted == [1, 1, 0, 0, 0]  # nothing behind it once it had waited 3 steps
    assert h.slots.slot_of("hot") is None and h.slots.slot_of("cold") == 0
    h.run_until_idle()
    assert h.acquired == h.released
    assert not h.scheduler.skipped_steps


def test_requests_admitted_before_a_starved_one_leave_the_queue_in_that_step():
    h = Harness(max_loras=1, max_num_batched_tokens=64, starvation_steps=1)
    h.request(2, adapter="hot", max_tokens=5)
    h.step()
    also_hot = h.request(2, adapter="hot", max_tokens=2)  # shares the resident slot
    cold = h.request(2, adapter="cold", max_tokens=2)  # no slot: starving at once
    plan = h.step()
    assert also_hot in [c.seq for c in plan.chunks] and also_hot.status is SequenceStatus.RUNNING
    assert list(h.scheduler.waiting) == [cold]
    h.run_until_idle()
    assert also_hot.output_token_ids == [FAKE_TOKEN] * 2 and cold.output_token_ids == [FAKE_TOKEN] * 2


def test_waiting_for_a_load_never_counts_as_starving_nor_holds_the_queue():
    h = Harness(max_loras=2, max_num_seqs=8, max_num_batched_tokens=64, starvation_steps=2)
    h.loading.add("cold")
    cold = h.request(2, adapter="cold", max_tokens=2)
    admitted_behind = 0
    for _ in range(6):  # three times the starvation threshold
        h.request(2, adapter="hot", max_tokens=1)
        plan = h.step()
        admitted_behind += sum(c.seq.adapter == "hot" and c.start == 0 for c in plan.chunks)
    assert cold.status is SequenceStatus.WAITING
    assert cold.request_id not in h.scheduler.skipped_steps, "a load in flight counted as starving"
    assert admitted_behind == 6, "requests behind a loading adapter were held back"
    h.loading.clear()  # the load finished: the next step admits it
    h.step()
    assert cold.status is SequenceStatus.RUNNING
    h.run_until_idle()
    assert h.acquired == h.released


def test_admission_looks_at_most_max_skipped_waiting_requests_per_step():
    h = Harness(max_loras=1, max_num_seqs=8, max_num_batched_tokens=64)
    h.scheduler.max_skipped = 3
    h.loading.update(f"cold{i}" for i in range(6))
    asked: list[str | None] = []
    gate = h.scheduler.acquire_adapter

    def counting_gate(name: str | None) -> Admission:
        asked.append(name)
        return gate(name)

    h.scheduler.acquire_adapter = counting_gate
    for i in range(6):
        h.request(2, adapter=f"cold{i}")
    base = h.request(2)  # behind six loading requests, past the look-ahead
    h.step()
    assert asked == ["cold0", "cold1", "cold2"]
    assert base.status is SequenceStatus.WAITING
    h.loading.clear()
    h.run_until_idle()
    assert base.is_finished


class CountingQueue(deque):
    """The scheduler's waiting queue, counting the entries anything iterates over."""

    seen = 0

    def __iter__(self):
        for item in super().__iter__():
            self.seen += 1
            yield item


@pytest.mark.parametrize("queued", [256, 16_384])
def test_a_step_looks_at_the_head_of_the_queue_only_and_keeps_its_order(queued):
    """Admission touches the requests it admits and those it passes over (at most
    ``max_skipped``), not the queue behind them: per-step work that does not grow with a
    deep queue. The rest stays in arrival order with the passed-over ones in front."""
    h = Harness(max_loras=1, max_num_seqs=4, max_num_batched_tokens=64)
    h.scheduler.max_skipped = 2
    h.scheduler.waiting = CountingQueue()
    h.loading.add("cold")
    cold = h.request(2, adapter="cold")
    queue = [cold] + [h.request(2) for _ in range(queued - 1)]
    h.scheduler.waiting.seen = 0
    plan = h.step()
    assert [chunk.seq for chunk in plan.chunks] == queue[1:5]
    assert h.scheduler.waiting.seen <= 4 + 2 + 1  # admitted + passed over + the one that stopped it
    assert list(h.scheduler.waiting) == [cold, *queue[5:]]


def test_without_starvation_pressure_skips_reset_when_the_request_is_admitted():
    h = Harness(max_loras=1, max_num_batched_tokens=64, starvation_steps=100)
    h.request(2, adapter="a", max_tokens=3)
    h.step()
    b = h.request(2, adapter="b", max_tokens=1)
    h.step()
    assert h.scheduler.skipped_steps[b.request_id] == 1
    h.run_until_idle()
    assert b.is_finished and b.request_id not in h.scheduler.skipped_steps


# ---------------------------------------------------------------- finish and abort


def test_finish_of_a_running_sequence_frees_blocks_and_releases_the_adapter_once():
    h = Harness()
    seq = h.request(10, adapter="a", max_tokens=50)
    h.step()
    assert seq.block_table and h.slots.in_use("a") == 1
    h.scheduler.finish(seq, "abort")
    assert seq.is_finished and seq.finish_reason == "abort"
    assert seq not in h.scheduler.running and seq.block_table == []
    assert h.blocks.num_free == h.blocks.num_blocks
    assert h.released["a"] == 1 and h.slots.in_use("a") == 0
    h.scheduler.finish(seq, "abort")  # a second finish is harmless
    assert h.released["a"] == 1
    assert h.blocks.num_free == h.blocks.num_blocks
    assert not h.scheduler.has_work


def test_abort_of_a_waiting_sequence_removes_it_without_releasing_anything():
    h = Harness(max_loras=1)
    h.request(2, adapter="a", max_tokens=9)
    h.step()
    waiting = h.request(2, adapter="b")
    h.step()
    assert waiting.request_id in h.scheduler.skipped_steps
    h.scheduler.finish(waiting, "abort")
    assert waiting not in h.scheduler.waiting and waiting.is_finished
    assert h.released["b"] == 0 and h.acquired["b"] == 0
    assert waiting.request_id not in h.scheduler.skipped_steps


def test_finish_of_a_sequence_that_never_reached_the_queue_leaves_the_queue_alone():
    h = Harness()
    queued = h.request(2)
    stray = Sequence("stray", [1, 2], None, SamplingParams(), arrival_step=0)  # WAITING, never added
    h.scheduler.finish(stray, "abort")
    assert stray.is_finished and stray.finish_reason == "abort"
    assert list(h.scheduler.waiting) == [queued]


def test_step_count_counts_every_scheduled_step_idle_or_not():
    h = Harness()
    assert h.scheduler.step_count == 0
    h.request(2, max_tokens=2)
    steps = h.run_until_idle()  # prefill, then one decode
    assert steps == 2 and h.scheduler.step_count == 2
    h.step()  # an idle step is a step too (the engine's "steps" metric)
    assert h.scheduler.step_count == 3


def test_abort_of_a_preempted_sequence_does_not_release_its_adapter_twice():
    h = Harness(num_blocks=4, block_size=4, max_num_batched_tokens=64)
    h.request(4, max_tokens=8)
    victim = h.request(4, adapter="x", max_tokens=8)
    while not h.step().preempted:
        pass
    assert victim.status is SequenceStatus.WAITING and h.released["x"] == 1
    h.scheduler.finish(victim, "abort")
    assert h.released["x"] == 1 and h.acquired["x"] == 1
    assert victim not in h.scheduler.waiting
    h.run_until_idle()
    assert h.blocks.num_free == h.blocks.num_blocks


# ---------------------------------------------------------------- randomized simulation


@pytest.mark.parametrize(("seed", "abort_rate"), [(0, 0.0), (1, 0.0), (2, 0.0), (3, 0.03)])
def test_random_workload_keeps_every_invariant_and_finishes_everything(seed, abort_rate):
    rng = random.Random(seed)
    num_blocks, block_size, max_loras = 24, 4, 3
    max_num_seqs, budget, max_len = 8, 20, 96  # one sequence of max_len fills the cache exactly
    h = Harness(num_blocks, block_size, max_loras, max_num_seqs, budget, starvation_steps=6)
    adapters = [None] + [f"adapter-{i}" for i in range(8)]
    pending = []
    for _ in range(200):
        prompt_len = rng.randint(1, 60)
        pending.append((prompt_len, rng.choice(adapters), rng.randint(1, max_len - prompt_len)))
    seqs: list[Sequence] = []
    idle_steps = 0
    preemptions = 0
    while pending or h.scheduler.has_work:
        for _ in range(rng.choice([0, 0, 1, 2, 4])):
            if pending:
                seqs.append(h.request(*pending.pop()))
        if seqs and rng.random() < abort_rate:  # abort something, in whatever state it is
            victim = rng.choice(seqs)
            if not victim.is_finished:
                h.scheduler.finish(victim, "abort")
        computed_before = {id(s): s.num_computed_tokens for s in h.scheduler.running}
        plan = h.step()
        preemptions += len(plan.preempted)
        idle_steps = 0 if plan.chunks else idle_steps + 1
        assert idle_steps < 50, "the scheduler stopped making progress"
        assert plan.num_tokens <= budget
        assert all(c.num_tokens >= 1 for c in plan.chunks)
        assert len({id(c.seq) for c in plan.chunks}) == len(plan.chunks)
        running = h.scheduler.running
        assert len(running) <= max_num_seqs
        assert len({s.adapter for s in running} - {None}) <= max_loras
        owned = h.owned_blocks()
        assert len(owned) == len(set(owned)), "a KV block is owned twice"
        assert len(owned) + h.blocks.num_free == num_blocks
        assert all(h.blocks.users_of(block) == 1 for block in owned)
        for seq in running:
            assert seq.status is SequenceStatus.RUNNING
            assert len(seq.block_table) * block_size >= seq.num_computed_tokens
            assert seq.num_computed_tokens >= computed_before.get(id(seq), 0)
        for seq in h.scheduler.waiting:
            assert seq.status is SequenceStatus.WAITING and seq.block_table == []
            assert seq.num_computed_tokens == 0
        assert sum(h.slots.in_use(name) for name in adapters[1:]) == sum(
            s.adapter is not None for s in running
        )
    assert preemptions > 0, "the workload should force preemption"
    assert all(s.is_finished for s in seqs)
    for seq in seqs:
        if seq.finish_reason == "length":
            assert len(seq.output_token_ids) == seq.params.max_tokens
            assert seq.output_token_ids == [FAKE_TOKEN] * seq.params.max_tokens
        else:
            assert seq.finish_reason == "abort"
            assert len(seq.output_token_ids) < seq.params.max_tokens
    if abort_rate == 0:
        assert all(s.finish_reason == "length" for s in seqs)
    else:
        assert 0 < sum(s.finish_reason == "abort" for s in seqs) < len(seqs) // 2
    assert h.blocks.num_free == num_blocks
    assert h.blocks.num_free == num_blocks and not any(map(h.blocks.users_of, range(num_blocks)))
    assert h.acquired == h.released
    assert all(h.slots.in_use(name) == 0 for name in adapters[1:])
    assert not h.scheduler.skipped_steps
