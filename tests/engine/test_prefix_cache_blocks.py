"""The prefix cache's bookkeeping: keys, reuse, eviction, dropping, and a randomized workload in
which every KV entry a step reads was written for the same tokens under the same salts."""

from __future__ import annotations

import random

import pytest

from multilora_studio.adapters.slot_table import SlotTable
from multilora_studio.engine.batch.block_manager import BlockManager
from multilora_studio.engine.batch.prefix_cache import extend_block_keys, kv_salt
from multilora_studio.engine.batch.scheduler import Admission, Scheduler
from multilora_studio.engine.batch.sequence import Sequence
from multilora_studio.engine.sampling_params import SamplingParams

BASE = kv_salt("base")


def make_seq(tokens: list[int], version: int | None = None, scale: float = 1.0, **params) -> Sequence:
    seq = Sequence(f"r{random.random()}", tokens, None if version is None else f"a{version}",
                   SamplingParams(**params), arrival_step=0)  # fmt: skip
    seq.base_salt = seq.kv_salt = BASE
    if version is not None:
        seq.adapter_version = version
        seq.kv_salt = kv_salt(BASE, version, scale)
    return seq


def computed(manager: BlockManager, seq: Sequence) -> None:
    """What a step does: every token but the last computed, full blocks indexed."""
    manager.take(seq, manager.cached_prefix(seq), seq.num_tokens)
    seq.num_computed_tokens = seq.num_tokens - 1
    manager.index_computed(seq)


def test_keys_chain_tokens_and_salts():
    tokens = list(range(40))
    plain, other_base = make_seq(tokens), make_seq(tokens)
    other_base.base_salt = other_base.kv_salt = kv_salt("another base")
    keys = extend_block_keys(plain, 8, 5)
    assert len(set(keys)) == 5
    assert extend_block_keys(make_seq(tokens), 8, 5) == keys  # deterministic
    assert set(extend_block_keys(other_base, 8, 5)).isdisjoint(keys)
    assert set(extend_block_keys(make_seq(tokens, version=1), 8, 5)).isdisjoint(keys)
    assert extend_block_keys(make_seq(tokens, 1), 8, 5) != extend_block_keys(make_seq(tokens, 1, 0.5), 8, 5)
    changed = make_seq([*tokens[:20], 999, *tokens[21:]])
    assert extend_block_keys(changed, 8, 5)[:2] == keys[:2]  # a change reaches its block and the later ones
    assert set(extend_block_keys(changed, 8, 5)[2:]).isdisjoint(keys)


def test_activated_adapter_blocks_before_its_start_are_the_bases():
    tokens = list(range(48))
    base = make_seq(tokens)
    late = make_seq(tokens, version=3)
    late.adapter_start = 20
    later = make_seq(tokens, version=3)
    later.adapter_start = 21
    base_keys, late_keys, later_keys = (extend_block_keys(s, 8, 6) for s in (base, late, later))
    assert late_keys[:2] == base_keys[:2]  # blocks 0-1 (positions < 16) are computed by the base
    assert late_keys[2] != base_keys[2] and late_keys[2] != later_keys[2]  # its start lies in block 2
    assert late.block_owner(1, 8) is None and late.block_owner(2, 8) == 3


def test_a_freed_prefix_is_reused_and_the_last_token_is_always_computed():
    manager = BlockManager(16, 4, prefix_caching=True)
    first = make_seq(list(range(10)), version=1)
    computed(manager, first)  # 9 computed: two full blocks indexed
    manager.free(first)
    assert manager.num_free == 16 and manager.cache.num_blocks == 2
    second = make_seq(list(range(12)), version=1)
    prefix = manager.cached_prefix(second)
    assert len(prefix) == 2
    manager.take(second, prefix, second.num_tokens)
    assert second.num_computed_tokens == 8 and second.num_cached_tokens == 8
    assert [manager.users_of(b) for b in second.block_table] == [1, 1, 1]
    exact = make_seq(list(range(8)), version=1)  # ends on the boundary: its last block is computed
    assert len(manager.cached_prefix(exact)) == 1


def test_cached_blocks_are_evicted_least_recently_freed_first_and_only_when_needed():
    manager = BlockManager(6, 2, prefix_caching=True)
    old, new = make_seq([1, 2, 3, 4, 5]), make_seq([9, 8, 7, 6, 5])
    computed(manager, old)
    manager.free(old)
    computed(manager, new)
    manager.free(new)
    assert manager.num_free == 6 and manager.cache.num_blocks == 4
    big = make_seq(list(range(100, 107)))  # four blocks: the two empty ones, then two evicted
    manager.grow(big, big.num_tokens)
    assert len(manager.cached_prefix(make_seq([9, 8, 7, 6, 5]))) == 2  # the newer prefix survives
    assert manager.cached_prefix(make_seq([1, 2, 3, 4, 5])) == []


def test_taking_cached_blocks_counts_against_the_free_pool():
    manager = BlockManager(4, 2, prefix_caching=True)
    seq = make_seq([1, 2, 3, 4, 5])
    computed(manager, seq)
    manager.free(seq)
    again = make_seq([1, 2, 3, 4, 5, 6, 7, 8, 9])
    prefix = manager.cached_prefix(again)
    assert len(prefix) == 2
    assert manager.can_take(prefix, 8) and not manager.can_take(prefix, 10)


def test_dropping_an_adapter_version_keeps_the_blocks_of_running_sequences():
    manager = BlockManager(12, 2, prefix_caching=True)
    gone, kept, base = make_seq([1, 2, 3, 4, 5], 7), make_seq([1, 2, 3, 4, 5], 7), make_seq([1, 2, 3, 4, 5])
    computed(manager, gone)
    manager.free(gone)
    computed(manager, base)
    computed(manager, kept)  # reuses gone's blocks and holds them
    assert kept.num_cached_tokens == 4
    assert manager.drop_cached(7) == 2
    assert manager.cached_prefix(make_seq([1, 2, 3, 4, 5], 7)) == []
    assert len(manager.cached_prefix(make_seq([1, 2, 3, 4, 5]))) == 2  # the base's stay
    held = list(kept.block_table)
    manager.free(kept)
    assert manager.num_free == 12 - len(base.block_table) and all(manager.users_of(b) == 0 for b in held)


def test_scores_still_to_compute_limit_the_hit():
    tokens = list(range(30))
    assert make_seq(tokens, prompt_logprobs=1).max_cached_tokens == 0
    assert make_seq(tokens, prompt_logprobs=1, prompt_logprobs_start=21).max_cached_tokens == 20
    assert make_seq(tokens).max_cached_tokens == 29


# ---------------------------------------------------------------- randomized workload


class KVCheck:
    """What each cache slot holds: the tokens up to it and the salts they were computed under."""

    def __init__(self, manager: BlockManager) -> None:
        self.manager = manager
        self.slots: dict[int, tuple] = {}

    @staticmethod
    def entry(seq: Sequence, position: int) -> tuple:
        salts = tuple(seq.base_salt if p < seq.adapter_start else seq.kv_salt for p in range(position + 1))
        return tuple(seq.token_slice(0, position + 1)), salts

    def run(self, seq: Sequence, start: int, count: int) -> None:
        for position in range(start):
            assert self.slots.get(self.manager.slot_of(seq, position)) == self.entry(seq, position), (
                f"{seq.request_id} read KV made for other tokens or weights at {position}"
            )
        for position in range(start, start + count):
            self.slots[self.manager.slot_of(seq, position)] = self.entry(seq, position)


@pytest.mark.parametrize("seed", range(4))
def test_random_shared_prefix_workload_reads_only_its_own_kv(seed):
    rng = random.Random(seed)
    manager = BlockManager(40, 4, prefix_caching=True)
    slots = SlotTable(3)
    versions = {f"a{i}": i + 1 for i in range(5)}

    def acquire(name: str | None) -> Admission:
        return Admission.READY if name is None or slots.acquire(name) is not None else Admission.NO_SLOT

    scheduler = Scheduler(manager, 6, 24, acquire, lambda n: n is not None and slots.release(n), 4)
    kv = KVCheck(manager)
    prefixes = [[rng.randrange(50) for _ in range(rng.randint(4, 30))] for _ in range(4)]
    seqs: list[Sequence] = []
    for step in range(600):
        if len(seqs) < 160 and rng.random() < 0.5:
            adapter = rng.choice([None, *versions])
            tokens = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randint(1, 12))]
            scale = rng.choice([1.0, 1.0, 0.5])
            seq = make_seq(tokens, None, scale, max_tokens=rng.randint(1, 10))
            seq.request_id, seq.adapter = f"s{len(seqs)}", adapter
            if adapter is not None:
                seq.adapter_version = versions[adapter]
                seq.kv_salt = kv_salt(BASE, versions[adapter], scale)
                seq.adapter_start = rng.choice([0, 0, rng.randint(1, len(tokens))])
            seqs.append(seq)
            scheduler.add(seq)
        if rng.random() < 0.02:  # an adapter reloaded: new weights under the same name
            name = rng.choice(list(versions))
            manager.drop_cached(versions[name])
            versions[name] += 100
        plan = scheduler.schedule()
        for chunk in plan.chunks:
            assert chunk.start == chunk.seq.num_computed_tokens
            kv.run(chunk.seq, chunk.start, chunk.num_tokens)
            chunk.seq.num_computed_tokens += chunk.num_tokens
            manager.index_computed(chunk.seq)
        for chunk in plan.chunks:
            seq = chunk.seq
            if chunk.completes:
                seq.output_token_ids.append(rng.randrange(50))
                if len(seq.output_token_ids) >= seq.params.max_tokens:
                    scheduler.finish(seq, "length")
        held = [b for s in scheduler.running for b in s.block_table]
        assert all(manager.users_of(b) == held.count(b) for b in set(held))
        assert len(set(held)) + manager.num_free == manager.num_blocks
        if step > 400 and not scheduler.has_work and len(seqs) >= 160:
            break
    while scheduler.has_work:
        plan = scheduler.schedule()
        for chunk in plan.chunks:
            kv.run(chunk.seq, chunk.start, chunk.num_tokens)
            chunk.seq.num_computed_tokens += chunk.num_tokens
            manager.index_computed(chunk.seq)
            if chunk.completes:
                chunk.seq.output_token_ids.append(1)
                if len(chunk.seq.output_token_ids) >= chunk.seq.params.max_tokens:
                    scheduler.finish(chunk.seq, "length")
    assert manager.cache.counters.hit_tokens > 0
    assert manager.num_free == manager.num_blocks
    assert not any(manager.cache.computing(key) for seq in seqs for key in seq.block_keys)


def test_requests_sent_together_with_one_context_compute_it_once():
    manager = BlockManager(64, 4, prefix_caching=True)
    scheduler = Scheduler(manager, 8, 64, lambda name: Admission.READY, lambda name: None)
    context = list(range(100, 121))  # five full blocks and one token
    choices = [make_seq([*context, 1, 2]), make_seq([*context, 3]), make_seq([*context, 4, 5, 6])]
    for seq in choices:
        scheduler.add(seq)
    first = scheduler.schedule()
    assert [chunk.seq for chunk in first.chunks] == choices[:1]  # the others wait for its blocks
    for chunk in first.chunks:
        chunk.seq.num_computed_tokens += chunk.num_tokens
        manager.index_computed(chunk.seq)
        chunk.seq.output_token_ids.append(7)
    second = [(chunk.seq, chunk.start) for chunk in scheduler.schedule().chunks]
    assert second == [(choices[0], 23), (choices[1], 20), (choices[2], 20)]
    assert [seq.num_cached_tokens for seq in choices] == [0, 20, 20]
