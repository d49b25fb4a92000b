"""Scheduler and block manager invariants under any interleaving (hypothesis).

Whatever order requests are added, stepped, finished, aborted and preempted in: no KV block
is owned twice or lost, a waiting sequence holds no blocks, a step never exceeds the token
budget or ``max_num_seqs``, every chunk has the blocks it writes, and once every sequence
has ended all blocks are free. The adapter gate admits everything (adapter slots are
tested in test_scheduler.py); a step is simulated as the engine does it.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from multilora_studio.engine.batch.block_manager import BlockManager
from multilora_studio.engine.batch.scheduler import Admission, Scheduler
from multilora_studio.engine.batch.sequence import Sequence, SequenceStatus
from multilora_studio.engine.sampling_params import SamplingParams

FAKE_TOKEN = 7
DRAIN_STEPS = 5_000
PROPERTY_SETTINGS = settings(
    max_examples=200, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def always_admit(adapter: str | None) -> Admission:
    return Admission.READY


def no_release(adapter: str | None) -> None:
    return None


class SchedulerMachine(RuleBasedStateMachine):
    """A scheduler over a real block manager, driven by random requests and engine events."""

    @initialize(
        num_blocks=st.integers(1, 24),
        block_size=st.sampled_from([1, 2, 4, 8]),
        max_num_seqs=st.integers(1, 6),
        extra_budget=st.integers(0, 40),
    )
    def build(self, num_blocks: int, block_size: int, max_num_seqs: int, extra_budget: int) -> None:
        self.capacity = max(2, num_blocks * block_size)
        self.blocks = BlockManager(-(-self.capacity // block_size), block_size)
        self.max_num_seqs = max_num_seqs
        self.budget = max_num_seqs + extra_budget  # EngineConfig requires budget >= max_num_seqs
        self.scheduler = Scheduler(self.blocks, max_num_seqs, self.budget, always_admit, no_release)
        self.live: list[Sequence] = []
        self.ended: list[Sequence] = []
        self.count = 0

    # ------------------------------------------------------------ what happens

    @rule(prompt=st.integers(1, 1000), max_tokens=st.integers(1, 1000))
    def add(self, prompt: int, max_tokens: int) -> None:
        """A request whose prompt and output fit the cache (the engine refuses longer ones)."""
        max_tokens = 1 + max_tokens % (self.capacity // 2)
        prompt = 1 + prompt % (self.capacity - max_tokens)
        self.count += 1
        seq = Sequence(
            f"r{self.count}", [self.count % 50 + 1] * prompt, None, SamplingParams(max_tokens=max_tokens), 0
        )
        self.scheduler.add(seq)
        self.live.append(seq)

    @rule()
    def step(self) -> None:
        self.run_one_step()

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 1000), reason=st.sampled_from(["stop", "abort"]))
    def end(self, pick: int, reason: str) -> None:
        """A stop string, a client that goes away (abort), whatever the sequence's state."""
        seq = self.live[pick % len(self.live)]
        self.scheduler.finish(seq, reason)
        self.ended_now(seq)

    @precondition(lambda self: self.scheduler.running)
    @rule(pick=st.integers(0, 1000))
    def preempt(self, pick: int) -> None:
        seq = self.scheduler.running[pick % len(self.scheduler.running)]
        self.scheduler.preempt(seq)
        assert seq.status is SequenceStatus.WAITING and seq.block_table == []

    # ------------------------------------------------------------ the engine's side of a step

    def run_one_step(self) -> None:
        plan = self.scheduler.schedule()
        assert plan.num_tokens <= self.budget
        assert len(self.scheduler.running) <= self.max_num_seqs
        scheduled = [chunk.seq for chunk in plan.chunks]
        assert len(set(map(id, scheduled))) == len(scheduled), "a sequence scheduled twice in one step"
        assert not {id(s) for s in plan.preempted} & {id(s) for s in scheduled}
        for chunk in plan.chunks:
            seq = chunk.seq
            assert seq.status is SequenceStatus.RUNNING and chunk.num_tokens >= 1
            assert chunk.start == seq.num_computed_tokens
            assert chunk.start + chunk.num_tokens <= seq.num_tokens
            assert len(seq.block_table) * self.blocks.block_size >= chunk.start + chunk.num_tokens
        for chunk in plan.chunks:
            chunk.seq.num_computed_tokens += chunk.num_tokens
        for chunk in plan.chunks:
            if chunk.completes:
                seq = chunk.seq
                seq.output_token_ids.append(FAKE_TOKEN)
                if len(seq.output_token_ids) >= seq.params.max_tokens:
                    self.scheduler.finish(seq, "length")
                    self.ended_now(seq)

    def ended_now(self, seq: Sequence) -> None:
        assert seq.is_finished and seq.block_table == []
        self.live.remove(seq)
        self.ended.append(seq)

    # ------------------------------------------------------------ invariants

    @invariant()
    def every_block_is_free_or_owned_by_exactly_one_live_sequence(self) -> None:
        owned = [block for seq in self.live for block in seq.block_table]
        assert len(owned) == len(set(owned)), "a block owned twice"
        assert all(0 <= block < self.blocks.num_blocks for block in owned)
        assert len(owned) + self.blocks.num_free == self.blocks.num_blocks, "a block lost or doubled"
        assert all(seq.block_table == [] for seq in self.ended)

    @invariant()
    def the_queues_hold_each_live_sequence_once(self) -> None:
        running, waiting = self.scheduler.running, list(self.scheduler.waiting)
        assert sorted(map(id, running + waiting)) == sorted(map(id, self.live))
        assert all(seq.status is SequenceStatus.RUNNING for seq in running)
        assert all(seq.status is SequenceStatus.WAITING and seq.block_table == [] for seq in waiting)
        assert len(running) <= self.max_num_seqs

    def teardown(self) -> None:
        """Without more events every request runs to its end, and every block comes back."""
        if not hasattr(self, "scheduler"):
            return
        for _ in range(DRAIN_STEPS):
            if not self.scheduler.has_work:
                break
            self.run_one_step()
        assert not self.scheduler.has_work, f"{len(self.live)} requests never finished"
        assert self.live == [] and self.blocks.num_free == self.blocks.num_blocks


TestSchedulerInvariants = SchedulerMachine.TestCase
TestSchedulerInvariants.settings = PROPERTY_SETTINGS


# One operation on a block manager: (sequence, tokens to grow to) or (sequence, None) to free.
OPERATIONS = st.lists(st.tuples(st.integers(0, 5), st.one_of(st.none(), st.integers(0, 70))), max_size=60)


@PROPERTY_SETTINGS
@given(num_blocks=st.integers(1, 16), block_size=st.sampled_from([1, 2, 4, 16]), operations=OPERATIONS)
def test_block_manager_hands_each_block_to_one_sequence_and_takes_all_back(
    num_blocks, block_size, operations
):
    blocks = BlockManager(num_blocks, block_size)
    seqs = [Sequence(f"s{i}", [1], None, SamplingParams(), 0) for i in range(6)]
    for index, tokens in operations:
        seq = seqs[index]
        if tokens is None:
            blocks.free(seq)
            assert seq.block_table == []
        else:
            before = list(seq.block_table)
            extra = -(-tokens // block_size) - len(before)
            if blocks.can_grow(seq, tokens):
                blocks.grow(seq, tokens)
                assert seq.block_table[: len(before)] == before  # grows, never moves its blocks
                assert len(seq.block_table) == max(len(before), -(-tokens // block_size))
            else:
                assert extra > blocks.num_free
        owned = [block for s in seqs for block in s.block_table]
        assert len(owned) == len(set(owned)) and len(owned) + blocks.num_free == num_blocks
        slots = [blocks.slot_of(s, p) for s in seqs for p in range(len(s.block_table) * block_size)]
        assert len(slots) == len(set(slots)) and all(0 <= slot < num_blocks * block_size for slot in slots)
    for seq in seqs:
        blocks.free(seq)
    assert blocks.num_free == num_blocks
    blocks.grow(seqs[0], num_blocks * block_size)
    assert sorted(seqs[0].block_table) == list(range(num_blocks))  # every block came back, each once
