"""Host-tier arena: packed adapters in borrowed blocks, blocks back when the adapter is gone."""

from __future__ import annotations

import gc

import pytest
import torch

from multilora_studio.adapters.peft_adapter import load_peft_adapter
from multilora_studio.bench.random_adapters import write_random_adapter
from multilora_studio.engine.model.lora_weights import LORA_GROUPS, PackedAdapter
from multilora_studio.engine.model.model_source import RANDOM_SHAPES
from multilora_studio.engine.residency.adapter_packing import pack_adapter, packed_shapes
from multilora_studio.engine.residency.pinned_arena import PinnedArena, carve, carved_bytes
from multilora_studio.engine.residency.upload_staging import stage_copy

SPEC = RANDOM_SHAPES["smollm2-135m"]


@pytest.fixture(scope="module")
def host_adapters(tmp_path_factory):
    root = tmp_path_factory.mktemp("arena-adapters")
    out = []
    for seed, rank in ((1, 8), (2, 16), (3, 4)):
        folder = write_random_adapter(SPEC, root / f"a{seed}", rank, seed=seed, dtype=torch.float32)
        out.append(load_peft_adapter(f"a{seed}", folder, SPEC.num_layers, SPEC.projection_shape, 16))
    # q and v only, with lora_B biases: the gaps of its groups and rows must come out zero
    partial = write_random_adapter(
        SPEC, root / "qv", 8, targets=("q_proj", "v_proj"), seed=4, dtype=torch.float32, kind="LoRA with bias"
    )
    out.append(load_peft_adapter("qv", partial, SPEC.num_layers, SPEC.projection_shape, 16))
    return out


def block_bytes(max_rank: int = 16) -> int:
    return carved_bytes(packed_shapes(SPEC, max_rank, list(LORA_GROUPS)), torch.float32)


def test_packed_in_a_block_equals_packed_alone(host_adapters):
    arena = PinnedArena(block_bytes(), 2, pin=False)
    for host in (*host_adapters[:2], host_adapters[3]):
        alone = pack_adapter(host, SPEC, torch.float32, pin=False)
        # Dirty the arena first: carved tensors must come out zeroed, then filled.
        arena._memory.fill_(0xFF)
        in_block = pack_adapter(host, SPEC, torch.float32, pin=False, arena=arena)
        for group in alone.a:
            assert torch.equal(in_block.a[group], alone.a[group])
            assert torch.equal(in_block.b[group], alone.b[group])
            assert arena.owns(in_block.a[group]), "not carved from the arena"
        assert alone.rows.keys() == in_block.rows.keys()
        assert all(torch.equal(in_block.rows[k], alone.rows[k]) for k in alone.rows)
        assert arena.free_blocks == 1
        del in_block
        gc.collect()
        assert arena.free_blocks == 2


def test_blocks_stay_taken_while_referenced_and_exhaustion_falls_back(host_adapters):
    arena = PinnedArena(block_bytes(), 2, pin=False)
    first = pack_adapter(host_adapters[0], SPEC, torch.float32, pin=False, arena=arena)
    second = pack_adapter(host_adapters[1], SPEC, torch.float32, pin=False, arena=arena)
    assert arena.free_blocks == 0
    third = pack_adapter(host_adapters[2], SPEC, torch.float32, pin=False, arena=arena)
    assert not arena.owns(third.a["qkv"]), "an exhausted arena must not hand out a block"
    assert arena.exhausted == 1 and not third.pinned  # counted; the adapter stays pageable
    expected = pack_adapter(host_adapters[0], SPEC, torch.float32, pin=False)
    # Packing the third adapter did not touch the first two.
    assert all(torch.equal(first.a[g], expected.a[g]) for g in expected.a)
    del second
    gc.collect()
    fourth = pack_adapter(host_adapters[2], SPEC, torch.float32, pin=False, arena=arena)
    assert arena.owns(fourth.a["qkv"])
    assert all(torch.equal(first.b[g], expected.b[g]) for g in expected.b)


def test_carve_rejects_what_does_not_fit_and_arena_rejects_empty():
    block = torch.empty(1024, dtype=torch.uint8)
    a, b = carve(block, [(4, 8), (2, 3)], torch.float32)
    assert a.shape == (4, 8) and b.shape == (2, 3) and not a.any() and not b.any()
    assert b.data_ptr() - a.data_ptr() == 256, "tensors start on 256-byte boundaries"
    with pytest.raises(ValueError, match="do not fit"):
        carve(block, [(300,)], torch.float32)
    with pytest.raises(ValueError, match="needs blocks"):
        PinnedArena(0, 4, pin=False)


def test_an_adapter_larger_than_a_block_is_packed_outside(host_adapters):
    arena = PinnedArena(block_bytes(max_rank=4), 1, pin=False)  # rank-16 adapter does not fit
    packed = pack_adapter(host_adapters[1], SPEC, torch.float32, pin=False, arena=arena)
    assert arena.free_blocks == 1
    assert packed.rank == 16 and packed.a["qkv"].shape[2] == 16


def test_for_tier_caps_by_memory_and_falls_back_when_pinning_fails(monkeypatch):
    from multilora_studio.engine.residency import pinned_arena

    monkeypatch.setattr(pinned_arena, "_physical_memory_bytes", lambda: 10 * 1024)
    assert PinnedArena.for_tier(4096, 8) is None, "a quarter of 10 KiB holds no 4 KiB block"
    # On a machine without CUDA, pinning raises: the tier then pins adapters one by one.
    monkeypatch.setattr(pinned_arena, "_physical_memory_bytes", lambda: 1 << 30)
    if not torch.cuda.is_available():
        assert PinnedArena.for_tier(4096, 2) is None
    else:
        arena = PinnedArena.for_tier(4096, 2)
        assert arena is not None and arena.free_blocks == 2


class PageableArena(PinnedArena):
    """The arena as ``for_tier`` builds it, in pageable memory: its sizing runs without CUDA."""

    def __init__(self, block_bytes: int, num_blocks: int, pin: bool = True) -> None:
        super().__init__(block_bytes, num_blocks, pin=False)


class UnpinnableArena(PinnedArena):
    """An arena whose memory cannot be pinned (as under a locked-memory limit)."""

    def __init__(self, block_bytes: int, num_blocks: int, pin: bool = True) -> None:
        raise RuntimeError("cannot pin: locked-memory limit")


def test_a_take_leaves_the_blocks_it_must_keep_and_a_stage_copy_equals_its_source(host_adapters):
    arena = PinnedArena(block_bytes(), 3, pin=False)
    host = host_adapters[0]
    kept = [pack_adapter(host, SPEC, torch.float32, pin=False, arena=arena, keep=1) for _ in range(3)]
    assert [p.pinned for p in kept] == [False, False, False]  # a pageable arena's blocks are not pinned
    assert [arena.owns(p.a["qkv"]) for p in kept] == [True, True, False]  # the last free block is kept
    assert arena.free_blocks == 1 and arena.exhausted == 1
    source = pack_adapter(host_adapters[3], SPEC, torch.float32, pin=False)  # pageable, with rows
    staged = PackedAdapter(source.name, source.rank, {}, {}, pinned=True)
    block = arena.take(staged)  # the kept block
    assert block is not None and arena.free_blocks == 0
    stage_copy(source, staged, block, torch.float32)
    assert staged.a.keys() == source.a.keys() and staged.rows.keys() == source.rows.keys()
    for group in source.a:
        assert torch.equal(staged.a[group], source.a[group]) and torch.equal(staged.b[group], source.b[group])
        assert arena.owns(staged.a[group]) and arena.owns(staged.b[group])
    for key, rows in source.rows.items():
        assert torch.equal(staged.rows[key], rows) and arena.owns(staged.rows[key])
    del staged
    gc.collect()
    assert arena.free_blocks == 1


def test_for_tier_takes_what_a_quarter_of_memory_holds(monkeypatch, caplog):
    from multilora_studio.engine.residency import pinned_arena

    # 4000-byte blocks take 4096 bytes each (256-byte alignment); a quarter of 50 KiB holds 3
    monkeypatch.setattr(pinned_arena, "_physical_memory_bytes", lambda: 50 * 1024)
    arena = PageableArena.for_tier(4000, 8)
    assert arena is not None and (arena.num_blocks, arena.block_bytes, arena.free_blocks) == (3, 4096, 3)
    assert PageableArena.for_tier(4000, 2).num_blocks == 2  # fewer asked than fit: as asked
    assert PageableArena.for_tier(4000, 8, ram_fraction=0.5).num_blocks == 6
    monkeypatch.setattr(pinned_arena, "_physical_memory_bytes", lambda: None)  # size unknown
    assert PageableArena.for_tier(4000, 8).num_blocks == 8
    assert UnpinnableArena.for_tier(4000, 8) is None
    assert "could not pin 8 x" in caplog.text and "locked-memory limit" in caplog.text


def test_blocks_are_distinct_counted_and_given_back_when_their_owner_goes():
    arena = PinnedArena(1000, 3, pin=False)
    assert arena.block_bytes == 1024

    class Owner:
        pass

    first, second, third, late = Owner(), Owner(), Owner(), Owner()
    blocks = [arena.take(owner) for owner in (first, second, third)]
    assert all(block is not None and block.numel() == 1024 for block in blocks)
    starts = sorted(block.data_ptr() for block in blocks)
    assert starts == [starts[0], starts[0] + 1024, starts[0] + 2048]  # blocks of the one allocation
    assert arena.free_blocks == 0 and arena.exhausted == 0
    assert arena.take(late) is None and arena.exhausted == 1
    assert arena.take(late) is None and arena.exhausted == 2
    released = blocks[1].data_ptr()
    del blocks, second
    gc.collect()
    assert arena.free_blocks == 1
    again = arena.take(late)
    assert again is not None and again.data_ptr() == released and arena.free_blocks == 0
    assert first is not None and third is not None  # their blocks stayed taken meanwhile
