"""Which columns a Compare run has: the adapters (and bases) ticked, the base whose adapters are
listed, the strength columns listed, each column's own settings; remembered between sessions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from multilora_studio.deploy import BasePool
from multilora_studio.gui.compare_bases import base_column, column_base, column_entries, slot_shortfall
from multilora_studio.gui.workflows.events import Field, Observable
from multilora_studio.gui.workflows.remembered import Store
from multilora_studio.run_records import (
    BASE,
    SWEEP_STRENGTHS,
    ColumnOverrides,
    column_choice,
    strength_column,
)

# ``changed`` names beside the fields: the list's entries, and which of them are ticked
ENTRIES, TICKS = "entries", "ticks"


@dataclass(frozen=True)
class Entry:
    """One line of the adapter list: a column name, its label, whether it has its own settings."""

    name: str
    label: str
    own_settings: bool


class AdapterChoices(Observable):
    """The ticks survive relisting: a column ticked under another base's listing stays ticked."""

    picked_base = Field[str | None](None)  # None: every base's adapters are listed

    def __init__(self, pools: Callable[[], BasePool | None]) -> None:
        super().__init__()
        self.pools = pools
        self.wanted: set[str] = {BASE}
        self.strengths: set[str] = set()  # columns of adapters at other strengths ("name x0.5")
        self.overrides: dict[str, ColumnOverrides] = {}

    # ---------------------------------------------------------------- the list

    def bases(self) -> list[str]:
        pool = self.pools()
        return [] if pool is None else pool.names

    def pick_base(self, base: str | None) -> None:
        """List the adapters of ``base`` only (None, or a base not served: of every base)."""
        self.picked_base = base if base in self.bases() else None

    def relist(self) -> None:
        """The engine's bases or adapters changed: list them again (a base no longer served is unpicked)."""
        self.pick_base(self.picked_base)
        self.changed.emit(ENTRIES)

    def entries(self) -> list[Entry]:
        """Each listed base (the picked one, else every one) without an adapter, then its adapters."""
        pool = self.pools()
        if pool is None:
            return []
        bases = [self.picked_base] if self.picked_base in pool.names else pool.names
        return [
            Entry(name, label, not self.own_settings(name).empty)
            for name, label in column_entries(pool, bases, self.strengths)
        ]

    # ---------------------------------------------------------------- ticks

    def ticked(self) -> list[str]:
        """The listed columns that are ticked, in list order (what a run sends to)."""
        return [entry.name for entry in self.entries() if entry.name in self.wanted]

    def set_ticked(self, name: str, ticked: bool) -> None:
        if (name in self.wanted) == ticked:
            return
        if ticked:
            self.wanted.add(name)
        else:
            self.wanted.discard(name)
        self.changed.emit(TICKS)

    def tick(self, names: list[str]) -> None:
        """Tick exactly ``names``."""
        self.wanted = set(names)
        self.changed.emit(TICKS)

    def tick_all(self, ticked: bool) -> None:
        """Tick (or untick) every listed column; those of bases not listed keep their ticks."""
        listed = {entry.name for entry in self.entries()}
        self.wanted = self.wanted | listed if ticked else self.wanted - listed
        self.changed.emit(TICKS)

    def choose(self, names: list[str]) -> None:
        """Tick ``names``, listing the strength columns among them."""
        self.strengths.update(name for name in names if column_choice(name)[1] != 1.0)
        self.tick(names)
        self.changed.emit(ENTRIES)

    def slot_warning(self) -> str | None:
        """A warning when a base's ticked adapters outnumber its GPU slots: they cannot all run in
        one batch."""
        pool = self.pools()
        short = slot_shortfall(pool, self.ticked()) if pool is not None else []
        if pool is None or not short:
            return None
        base, ticked, slots = short[0]
        where = f"the engine of {base}" if len(pool.names) > 1 else "the engine"
        return (
            f"{ticked} adapters ticked but {where} has {slots} GPU slots (max_loras): "
            f"{ticked - slots} wait until a slot frees, so the columns do not all run in one "
            "batch and their numbers are not comparable (see each column's queue time). "
            "Tick fewer or raise max_loras in Settings."
        )

    # ---------------------------------------------------------------- strength sweep

    def sweep_target(self, selected: str | None) -> str | None:
        """The adapter a sweep varies: the selected column's (``selected``), else the first ticked
        adapter's; None when neither is an adapter."""
        bases = set(self.bases())
        choice = column_choice(selected)[0] if selected is not None and selected not in bases else None
        ticked = [column_choice(name)[0] for name in self.ticked() if name != BASE and name not in bases]
        return choice or (ticked[0] if ticked else None)

    def sweep(self, adapter: str) -> None:
        """Tick ``adapter``'s base and ``adapter`` at every SWEEP_STRENGTHS (columns "name x0.25", ...)."""
        columns = [strength_column(adapter, scale) for scale in SWEEP_STRENGTHS]
        pool = self.pools()
        base = column_base(pool, adapter) if pool is not None else None
        self.choose([base_column(pool, base) if pool is not None and base is not None else BASE, *columns])

    # ---------------------------------------------------------------- own settings

    def own_settings(self, name: str) -> ColumnOverrides:
        return self.overrides.get(name, ColumnOverrides())

    def set_own_settings(self, name: str, overrides: ColumnOverrides) -> None:
        self.overrides[name] = overrides
        self.changed.emit(ENTRIES)

    # ---------------------------------------------------------------- remembered

    def save(self, store: Store) -> None:
        store.set("compare/adapters", sorted(self.wanted))
        store.set(
            "compare/column_settings",
            {name: overrides_dict(o) for name, o in self.overrides.items() if not o.empty},
        )

    def restore(self, store: Store) -> None:
        self.overrides = {}
        for name, data in store.get("compare/column_settings", {}).items():
            try:
                self.overrides[name] = ColumnOverrides.from_dict(data)
            except (TypeError, ValueError):
                continue
        self.choose(list(store.get("compare/adapters", [BASE])))


def overrides_dict(overrides: ColumnOverrides) -> dict:
    return {
        "temperature": overrides.temperature,
        "max_tokens": overrides.max_tokens,
        "stop": None if overrides.stop is None else list(overrides.stop),
        "seed": overrides.seed,
    }
