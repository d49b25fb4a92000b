"""GPU slot assignment for adapters: LRU with pinning, never evicting an adapter in use.

Plain Python. The engine asks ``acquire(name)`` when a request is admitted and
``release(name)`` when it finishes or is preempted; an adapter with running
requests (``in_use > 0``) or a pin keeps its slot. Both calls count as a use for
the LRU order. At most ``capacity - 1`` adapters can be pinned, so one slot always
stays evictable and requests for unpinned adapters can still run.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from multilora_studio.invalid_setting import InvalidSetting


@dataclass(frozen=True)
class SlotInfo:
    slot: int
    adapter: str | None
    pinned: bool
    in_use: int


@dataclass(frozen=True)
class Acquired:
    slot: int
    needs_load: bool
    evicted: str | None


class SlotTable:
    """Maps adapter names to ``capacity`` slots."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._slot_of: OrderedDict[str, int] = OrderedDict()  # LRU order: oldest first
        self._in_use: dict[str, int] = {}
        self._pinned: set[str] = set()
        self._free: list[int] = list(range(capacity - 1, -1, -1))

    def slot_of(self, name: str) -> int | None:
        return self._slot_of.get(name)

    def in_use(self, name: str) -> int:
        return self._in_use.get(name, 0)

    def _victim(self) -> str | None:
        idle = self.evictable()
        return idle[0][0] if idle else None

    def evictable(self) -> list[tuple[str, int]]:
        """(adapter, slot) of every adapter that may leave its slot now, least recently used first."""
        return [
            (name, slot)
            for name, slot in self._slot_of.items()
            if self._in_use.get(name, 0) == 0 and name not in self._pinned
        ]

    def can_acquire(self, name: str) -> bool:
        return name in self._slot_of or bool(self._free) or self._victim() is not None

    def acquire(self, name: str) -> Acquired | None:
        """Reserve a slot for ``name`` (one more user); None when every slot is busy or pinned."""
        evicted = None
        if name in self._slot_of:
            self._slot_of.move_to_end(name)
            slot, needs_load = self._slot_of[name], False
        else:
            if not self._free:
                evicted = self._victim()
                if evicted is None:
                    return None
                self._free.append(self._slot_of.pop(evicted))
                self._in_use.pop(evicted, None)
            slot, needs_load = self._free.pop(), True
            self._slot_of[name] = slot
        self._in_use[name] = self._in_use.get(name, 0) + 1
        return Acquired(slot, needs_load, evicted)

    def release(self, name: str) -> None:
        count = self._in_use.get(name, 0)
        if count <= 0:
            raise RuntimeError(f"release of adapter {name!r} that holds no slot reference")
        self._in_use[name] = count - 1
        self._slot_of.move_to_end(name)  # used until now: the most recently used

    def pin(self, name: str) -> None:
        """Keep ``name`` in its slot once loaded; InvalidSetting (``max_loras``) when no slot would stay
        evictable."""
        if name not in self._pinned and len(self._pinned) >= self.capacity - 1:
            raise InvalidSetting(
                "cannot pin {adapter!r}: {pinned} of {slots} GPU slots are pinned already and one must "
                "stay free for other adapters; unpin one or raise {max_loras}",
                {"max_loras": self.capacity},
                {"adapter": name, "pinned": len(self._pinned), "slots": self.capacity},
            )
        self._pinned.add(name)

    def unpin(self, name: str) -> None:
        self._pinned.discard(name)

    def is_pinned(self, name: str) -> bool:
        return name in self._pinned

    def pinned_names(self) -> frozenset[str]:
        return frozenset(self._pinned)

    def evict(self, name: str) -> int | None:
        """Drop ``name`` from its slot (it must not be in use); return the freed slot."""
        if self._in_use.get(name, 0) > 0:
            raise RuntimeError(f"adapter {name!r} is used by running requests")
        self._pinned.discard(name)
        slot = self._slot_of.pop(name, None)
        self._in_use.pop(name, None)
        if slot is not None:
            self._free.append(slot)
        return slot

    def snapshot(self) -> list[SlotInfo]:
        by_slot = {slot: name for name, slot in self._slot_of.items()}
        return [
            SlotInfo(
                slot,
                by_slot.get(slot),
                by_slot.get(slot) in self._pinned,
                self._in_use.get(by_slot.get(slot, ""), 0),
            )
            for slot in range(self.capacity)
        ]
