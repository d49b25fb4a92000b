"""The adapter-affinity rule: which engine replica a request for an adapter goes to.

The least-loaded replica whose GPU slots hold the adapter, else whose host tier holds it, unless
that one has more than ``margin`` requests (running + queued) over the least-loaded replica of
all; then, or when no replica holds it, the least-loaded replica (the first of equals). A
bounded margin keeps an adapter where it is loaded while the load stays balanced within it:
0 is least-loaded routing, a large margin is pure affinity.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

DEFAULT_MARGIN = 8  # requests; docs/scale-out.md: fewer loads than 4, the same tail as 16


def affinity_pick(
    loads: Sequence[int] | np.ndarray, holders: Sequence[Collection[int] | None], margin: int
) -> int:
    """The replica (an index into ``loads``) for one request.

    ``loads[i]``: replica i's requests running + queued (a replica that may not take requests
    has a load larger than any other's). ``holders``: the replicas holding the adapter, one
    collection per tier, best tier first (GPU slots, then host RAM)."""
    least = int(np.argmin(loads))
    for tier in holders:
        if tier:
            best = min(tier, key=lambda r: (loads[r], r))
            return best if loads[best] <= loads[least] + margin else least
    return least
