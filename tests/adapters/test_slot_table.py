"""GPU slot assignment: LRU order, pinning, never evicting adapters in use, capacity limits."""

from __future__ import annotations

import random

import pytest

from multilora_studio.adapters.slot_table import Acquired, SlotInfo, SlotTable


def fill(table: SlotTable, *names: str) -> None:
    """Load ``names`` (in this order) and leave them resident but unused."""
    for name in names:
        assert table.acquire(name) is not None
        table.release(name)


@pytest.mark.parametrize("capacity", [0, -1])
def test_capacity_must_be_positive(capacity):
    with pytest.raises(ValueError, match="capacity"):
        SlotTable(capacity)


def test_first_acquire_loads_into_a_free_slot_and_later_ones_reuse_it():
    table = SlotTable(3)
    first = table.acquire("a")
    assert first == Acquired(first.slot, needs_load=True, evicted=None)
    second = table.acquire("b")
    assert second.needs_load and second.slot != first.slot
    again = table.acquire("a")
    assert again == Acquired(first.slot, needs_load=False, evicted=None)
    assert table.in_use("a") == 2 and table.in_use("b") == 1 and table.in_use("never") == 0
    assert table.slot_of("a") == first.slot and table.slot_of("never") is None
    assert {first.slot, second.slot} <= {0, 1, 2}


def test_least_recently_used_idle_adapter_is_evicted():
    table = SlotTable(3)
    fill(table, "a", "b", "c")
    slot_of_a = table.slot_of("a")
    got = table.acquire("d")
    assert got == Acquired(slot_of_a, needs_load=True, evicted="a")
    assert table.slot_of("a") is None and table.slot_of("d") == slot_of_a
    assert table.in_use("a") == 0


def test_acquiring_again_makes_an_adapter_recently_used():
    table = SlotTable(3)
    fill(table, "a", "b", "c")
    fill(table, "a")  # touch a: b is now the oldest
    assert table.acquire("d").evicted == "b"
    assert table.acquire("e").evicted == "c"
    assert table.acquire("f").evicted == "a"


def test_release_counts_as_a_use_for_the_lru_order():
    table = SlotTable(2)
    assert table.acquire("long") is not None  # acquired first, used until later
    fill(table, "short")  # acquired and released while "long" still runs
    table.release("long")  # "long" was used last
    assert table.acquire("new").evicted == "short"


def test_adapters_in_use_are_never_evicted_and_a_full_table_refuses():
    table = SlotTable(2)
    table.acquire("a")
    table.acquire("b")
    assert not table.can_acquire("c")
    assert table.acquire("c") is None
    assert table.slot_of("c") is None and table.in_use("c") == 0
    assert table.can_acquire("a")  # already resident: one more user is fine
    assert table.acquire("a").needs_load is False
    table.release("a")
    table.release("a")
    assert table.can_acquire("c")
    assert table.acquire("c").evicted == "a"
    assert table.slot_of("b") is not None and table.in_use("b") == 1


def test_pinned_adapters_keep_their_slot_until_unpinned():
    table = SlotTable(3)
    fill(table, "a", "b", "c")
    table.pin("a")
    table.pin("b")
    assert table.is_pinned("a") and not table.is_pinned("c")
    assert table.acquire("d").evicted == "c"
    table.acquire("d")
    assert table.acquire("e") is None  # a and b pinned, d in use
    table.unpin("a")
    assert not table.is_pinned("a")
    assert table.acquire("e").evicted == "a"


def test_pin_before_load_applies_once_loaded():
    table = SlotTable(2)
    table.pin("later")
    fill(table, "x", "later")
    assert table.acquire("y").evicted == "x"
    table.release("y")
    assert table.acquire("z").evicted == "y"
    assert table.slot_of("later") is not None


def test_pins_are_capped_so_one_slot_stays_evictable():
    table = SlotTable(3)
    table.pin("a")
    table.pin("b")
    table.pin("b")  # pinning again is fine
    with pytest.raises(ValueError, match=r"cannot pin 'c'.*2 of 3 GPU slots"):
        table.pin("c")
    assert not table.is_pinned("c")
    fill(table, "a", "b")
    fill(table, *(f"other-{i}" for i in range(5)))  # the unpinned slot keeps serving others
    assert table.slot_of("a") is not None and table.slot_of("b") is not None
    table.unpin("a")
    table.pin("c")
    assert table.is_pinned("c")
    with pytest.raises(ValueError, match="cannot pin"):
        SlotTable(1).pin("only")


def test_release_without_a_reference_raises():
    table = SlotTable(2)
    with pytest.raises(RuntimeError, match="'ghost'"):
        table.release("ghost")
    table.acquire("a")
    table.release("a")
    with pytest.raises(RuntimeError, match="holds no slot reference"):
        table.release("a")
    assert table.in_use("a") == 0


def test_evict_frees_the_slot_drops_the_pin_and_refuses_adapters_in_use():
    table = SlotTable(2)
    slot = table.acquire("a").slot
    with pytest.raises(RuntimeError, match="used by running requests"):
        table.evict("a")
    assert table.slot_of("a") == slot
    table.release("a")
    table.pin("a")
    assert table.evict("a") == slot
    assert table.slot_of("a") is None and not table.is_pinned("a")
    assert table.evict("a") is None  # not resident: nothing to free
    fill(table, "b", "c")  # both slots usable again
    assert {table.slot_of("b"), table.slot_of("c")} == {0, 1}


def test_snapshot_lists_every_slot():
    table = SlotTable(3)
    a = table.acquire("a").slot
    b = table.acquire("b").slot
    table.acquire("b")
    table.release("a")
    table.pin("a")
    free = ({0, 1, 2} - {a, b}).pop()
    assert table.snapshot() == sorted(
        [SlotInfo(a, "a", True, 0), SlotInfo(b, "b", False, 2), SlotInfo(free, None, False, 0)],
        key=lambda info: info.slot,
    )


def test_random_operations_respect_capacity_pins_and_users():
    rng = random.Random(3)
    capacity = 4
    table = SlotTable(capacity)
    names = [f"ad{i}" for i in range(9)]
    users = dict.fromkeys(names, 0)
    pinned: set[str] = set()
    for _ in range(5000):
        name = rng.choice(names)
        op = rng.random()
        if op < 0.5:
            resident_before = {n: table.slot_of(n) for n in names if table.slot_of(n) is not None}
            possible = table.can_acquire(name)
            got = table.acquire(name)
            assert (got is not None) == possible
            if got is not None:
                users[name] += 1
                if got.evicted is not None:
                    assert users[got.evicted] == 0 and got.evicted not in pinned
                    assert got.slot == resident_before[got.evicted]
                assert got.needs_load == (name not in resident_before)
            else:
                assert len(resident_before) == capacity
                assert all(users[n] > 0 or n in pinned for n in resident_before)
        elif op < 0.85:
            if users[name]:
                table.release(name)
                users[name] -= 1
        elif op < 0.95:
            if name in pinned:
                table.unpin(name)
                pinned.discard(name)
            elif len(pinned) < capacity - 1:
                table.pin(name)
                pinned.add(name)
        elif users[name] == 0:
            table.evict(name)
            pinned.discard(name)
        resident = {n: table.slot_of(n) for n in names if table.slot_of(n) is not None}
        assert len(resident) <= capacity
        assert len(set(resident.values())) == len(resident)
        assert all(n in resident for n in names if users[n] > 0)
        assert all(table.in_use(n) == users[n] for n in names)
        snapshot = table.snapshot()
        assert [info.slot for info in snapshot] == list(range(capacity))
        assert {info.adapter for info in snapshot} - {None} == set(resident)
