"""The adapter-affinity rule on hand-checked cases: slot holders first, then host holders, each
only within the margin of the least-loaded replica; least-loaded otherwise, first of equals."""

from __future__ import annotations

import numpy as np
import pytest

from multilora_studio.deploy.dispatch_rule import affinity_pick


@pytest.mark.parametrize(
    ("loads", "slots", "host", "margin", "chosen"),
    [
        ([0, 0, 0], set(), set(), 8, 0),  # nobody holds it: the first of the least loaded
        ([3, 1, 1], set(), set(), 8, 1),
        ([5, 2, 9], {2}, set(), 8, 2),  # 9 <= 2 + 8: stays with its holder
        ([5, 2, 10], {2}, set(), 8, 2),  # 10 <= 2 + 8: exactly the margin still stays
        ([5, 2, 11], {2}, set(), 8, 1),  # 11 > 2 + 8: the least loaded instead
        ([4, 6, 0], {0, 1}, set(), 8, 0),  # of two holders the less loaded
        ([6, 4, 0], {0, 1}, set(), 8, 1),  # ... whatever its index
        ([6, 6, 0], {1, 0}, set(), 8, 0),  # equal holders: the first
        ([7, 1, 3], set(), {2}, 1, 1),  # a host holder over the margin: the least loaded
        ([7, 1, 2], set(), {2}, 1, 2),  # within it: the host holder
        ([0, 9, 5], {1}, {2}, 4, 0),  # the slot holder is over the margin: no fall back to host tier
        ([3, 3, 3], {2}, {0}, 0, 2),  # margin 0 still prefers a holder among equals
        ([3, 2, 3], {2}, {0}, 0, 1),  # margin 0: least loaded
    ],
)
def test_affinity_pick(loads, slots, host, margin, chosen):
    assert affinity_pick(loads, (slots, host), margin) == chosen
    assert affinity_pick(np.array(loads), (slots, host), margin) == chosen


def test_a_replica_that_may_not_take_requests_is_never_least_loaded():
    unavailable = np.iinfo(np.int64).max // 2
    assert affinity_pick([unavailable, 4], ({0}, set()), 8) == 1
    assert affinity_pick([unavailable, unavailable, 7], (set(), None), 8) == 2
