"""Which base model each Compare column runs on, when the window serves several (no Qt).

Column names are the server's model names: ``base`` is the first base without an adapter,
another base without an adapter is called by its own name, an adapter by its name (at a
strength: ``name x0.5``). A column runs on the base that serves its adapter, never elsewhere.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from multilora_studio.deploy import BasePool
from multilora_studio.run_records import BASE, column_choice


def column_base(pool: BasePool, name: str) -> str | None:
    """The base column ``name`` runs on; None when no base serves it."""
    if name == BASE:
        return pool.primary
    if name in pool.names:
        return name
    adapter = column_choice(name)[0]
    found = pool.base_of(adapter) if adapter is not None else None
    return found[0] if found is not None and found[1] is not None else None


def column_base_of(pool: BasePool, name: str) -> str:
    """The base column ``name`` runs on (ValueError when no base serves it)."""
    base = column_base(pool, name)
    if base is None:
        raise ValueError(f"no base model serves {column_choice(name)[0]!r}; tick another adapter")
    return base


def base_column(pool: BasePool, base: str) -> str:
    """The column name of ``base`` without an adapter."""
    return BASE if base == pool.primary else base


def column_entries(pool: BasePool, bases: Iterable[str], strengths: Iterable[str]) -> list[tuple[str, str]]:
    """(column name, label) of the adapter list: each of ``bases`` without an adapter, then its
    adapters and the ``strengths`` columns of them; labels name the base when the pool has several."""
    several = len(pool.names) > 1
    entries = []
    for base in bases:
        served = set(pool.adapters_of(base))
        variants = {name for name in strengths if column_choice(name)[0] in served}
        own = base_column(pool, base)
        entries.append((own, f"{BASE} ({base})" if own == BASE else f"{base} (base model)"))
        entries += [(name, f"{name}  · {base}" if several else name) for name in sorted(served | variants)]
    return entries


def slot_shortfall(pool: BasePool, names: Iterable[str]) -> list[tuple[str, int, int]]:
    """(base, adapters ticked, its GPU slots) for each base whose ticked adapter columns
    outnumber its slots (they cannot all run in one batch)."""
    ticked: Counter[str] = Counter()
    for name in names:
        base = column_base(pool, name)
        if base is not None and column_choice(name)[0] is not None and name not in pool.names:
            ticked[base] += 1
    return [
        (base, count, pool.base(base).config.max_loras)
        for base, count in ticked.items()
        if count > pool.base(base).config.max_loras
    ]
