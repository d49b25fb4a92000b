"""Paged KV bookkeeping: free list, growth, freeing, cache slots; no block is ever owned twice."""

from __future__ import annotations

import random

import pytest

from multilora_studio.engine.batch.block_manager import BlockManager, blocks_needed
from multilora_studio.engine.batch.sequence import Sequence
from multilora_studio.engine.sampling_params import SamplingParams


def make_seq(name: str = "r", prompt_len: int = 1) -> Sequence:
    return Sequence(name, list(range(prompt_len)), None, SamplingParams(), arrival_step=0)


@pytest.mark.parametrize(
    ("tokens", "block_size", "expected"),
    [(0, 16, 0), (1, 16, 1), (15, 16, 1), (16, 16, 1), (17, 16, 2), (33, 16, 3), (5, 1, 5), (7, 4, 2)],
)
def test_blocks_needed_rounds_up(tokens, block_size, expected):
    assert blocks_needed(tokens, block_size) == expected


@pytest.mark.parametrize(("num_blocks", "block_size"), [(0, 16), (-3, 16), (4, 0), (4, -1)])
def test_rejects_empty_caches_and_blocks(num_blocks, block_size):
    with pytest.raises(ValueError, match="block"):
        BlockManager(num_blocks, block_size)


def test_grow_allocates_distinct_blocks_only_when_a_block_boundary_is_crossed():
    manager = BlockManager(8, 4)
    seq = make_seq()
    manager.grow(seq, 1)
    assert len(seq.block_table) == 1 and manager.num_free == 7
    manager.grow(seq, 4)  # still the first block
    assert len(seq.block_table) == 1
    manager.grow(seq, 5)
    assert len(seq.block_table) == 2
    manager.grow(seq, 3)  # never shrinks
    assert len(seq.block_table) == 2
    manager.grow(seq, 17)
    assert len(seq.block_table) == 5 and manager.num_free == 3
    assert len(set(seq.block_table)) == 5
    assert all(0 <= block < 8 for block in seq.block_table)


def test_extra_blocks_and_can_grow_agree_with_grow():
    manager = BlockManager(4, 4)
    seq = make_seq()
    assert manager.extra_blocks_for(seq, 0) == 0
    assert manager.extra_blocks_for(seq, 9) == 3
    assert manager.can_grow(seq, 16) and not manager.can_grow(seq, 17)
    manager.grow(seq, 9)
    assert manager.extra_blocks_for(seq, 9) == 0
    assert manager.extra_blocks_for(seq, 13) == 1
    assert manager.can_grow(seq, 16) and not manager.can_grow(seq, 17)


def test_grow_past_the_free_list_raises_and_allocates_nothing():
    manager = BlockManager(3, 2)
    other = make_seq("other")
    manager.grow(other, 4)  # 2 blocks
    seq = make_seq()
    with pytest.raises(RuntimeError, match="KV cache exhausted"):
        manager.grow(seq, 3)  # needs 2, 1 free
    assert seq.block_table == [] and manager.num_free == 1
    manager.grow(seq, 2)
    assert manager.num_free == 0


def test_free_returns_every_block_and_is_idempotent():
    manager = BlockManager(6, 2)
    a, b = make_seq("a"), make_seq("b")
    manager.grow(a, 5)
    manager.grow(b, 6)
    assert manager.num_free == 0
    blocks_of_a = list(a.block_table)
    manager.free(a)
    assert a.block_table == [] and manager.num_free == 3
    manager.free(a)  # a second free adds nothing
    assert manager.num_free == 3
    c = make_seq("c")
    manager.grow(c, 6)
    assert sorted(c.block_table) == sorted(blocks_of_a)  # the freed blocks are reused
    assert set(c.block_table).isdisjoint(b.block_table)
    manager.free(b)
    manager.free(c)
    assert manager.num_free == 6


def test_slot_of_maps_positions_through_the_block_table():
    manager = BlockManager(8, 4)
    filler, seq = make_seq("filler"), make_seq("seq")
    manager.grow(filler, 4)
    manager.grow(seq, 4)
    manager.free(filler)
    manager.grow(filler, 8)  # interleave, so seq's blocks are not contiguous
    manager.grow(seq, 12)
    assert len(seq.block_table) == 3
    for position in range(12):
        block = seq.block_table[position // 4]
        assert manager.slot_of(seq, position) == block * 4 + position % 4
    slots_seq = {manager.slot_of(seq, p) for p in range(12)}
    slots_filler = {manager.slot_of(filler, p) for p in range(8)}
    assert len(slots_seq) == 12 and slots_seq.isdisjoint(slots_filler)
    assert all(0 <= slot < 8 * 4 for slot in slots_seq | slots_filler)


@pytest.mark.parametrize("position", [-1, 12, 100])
def test_slot_of_refuses_positions_outside_the_blocks(position):
    manager = BlockManager(8, 4)
    seq = make_seq()
    manager.grow(seq, 10)
    with pytest.raises(IndexError, match=f"position {position}"):
        manager.slot_of(seq, position)


def test_random_grow_and_free_never_shares_a_block_and_returns_everything():
    rng = random.Random(7)
    num_blocks, block_size = 50, 4
    manager = BlockManager(num_blocks, block_size)
    seqs = [make_seq(f"s{i}") for i in range(12)]
    wanted = {id(s): 0 for s in seqs}
    for _ in range(3000):
        seq = rng.choice(seqs)
        if rng.random() < 0.15:
            manager.free(seq)
            wanted[id(seq)] = 0
        else:
            target = wanted[id(seq)] + rng.randint(1, 9)
            if manager.can_grow(seq, target):
                manager.grow(seq, target)
                wanted[id(seq)] = target
            else:
                with pytest.raises(RuntimeError):
                    manager.grow(seq, target)
        owned = [block for s in seqs for block in s.block_table]
        assert len(owned) == len(set(owned))
        assert len(owned) + manager.num_free == num_blocks
        for s in seqs:
            assert len(s.block_table) == blocks_needed(wanted[id(s)], block_size)
    for seq in seqs:
        manager.free(seq)
    assert manager.num_free == num_blocks
    everything = make_seq("all")
    manager.grow(everything, num_blocks * block_size)
    assert sorted(everything.block_table) == list(range(num_blocks))
