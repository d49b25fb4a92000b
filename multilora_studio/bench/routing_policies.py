"""Where a request for an adapter goes among engine replicas: the routing study's policies.

Each policy sees every replica's load (requests running + queued) and which adapters each
holds in its GPU slots and in its host tier, and picks one replica:

* ``round-robin``: replicas in turn, whatever they hold;
* ``least-loaded``: the replica with the fewest requests (the first of equals);
* ``affinity``: this project's dispatcher rule (``deploy.dispatch_rule.affinity_pick``);
* ``ray-multiplexed``: Ray Serve's documented multiplexed routing: the candidates are the
  replicas that have the model (here: the adapter in the host tier, the set a replica's
  ``@serve.multiplexed`` cache would hold), else those with the fewest models loaded, else
  all, each level counting only replicas below ``max_ongoing`` requests (Ray's
  ``max_ongoing_requests``, set to the engine's batch); among them, the shorter queue of two
  chosen at random (power of two choices).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from multilora_studio.deploy.dispatch_rule import DEFAULT_MARGIN, affinity_pick

POLICIES = ("round-robin", "least-loaded", "affinity", "ray-multiplexed")


@dataclass
class ReplicaCaches:
    """One replica's GPU slots and host tier, least recently used first (adapter -> None), and
    how many of its running requests use each adapter (those keep their slot)."""

    slots: OrderedDict[int, None] = field(default_factory=OrderedDict)
    host: OrderedDict[int, None] = field(default_factory=OrderedDict)
    in_use: dict[int, int] = field(default_factory=dict)


class Router:
    """Picks replicas under ``policy`` and keeps what each replica holds.

    ``load[i]``: replica i's running + queued requests (the simulation updates it). ``use``
    and ``done`` move adapters through each replica's LRU slots (``slots`` of them) and host
    tier (``host`` adapters), as the engine does.
    """

    def __init__(
        self,
        policy: str,
        replicas: int,
        slots: int,
        host: int,
        margin: int = DEFAULT_MARGIN,
        seed: int = 0,
        max_ongoing: int = 32,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown routing policy {policy!r}; choose one of {', '.join(POLICIES)}")
        if host <= slots:
            raise ValueError(f"the host tier ({host}) must hold more adapters than the slots ({slots})")
        self.policy = policy
        self.margin = margin
        self.max_ongoing = max_ongoing
        self.slots, self.host = slots, host
        self.load = np.zeros(replicas, dtype=np.int64)
        self.host_count = np.zeros(replicas, dtype=np.int64)
        self.caches = [ReplicaCaches() for _ in range(replicas)]
        self.in_slots: dict[int, set[int]] = {}  # adapter -> replicas with it in a slot
        self.in_host: dict[int, set[int]] = {}  # adapter -> replicas with it in host RAM
        self._next = 0
        self._random = random.Random(seed)

    # -------------------------------------------------------------------------- picking

    def pick(self, adapter: int) -> int:
        if self.policy == "round-robin":
            chosen, self._next = self._next, (self._next + 1) % len(self.load)
            return chosen
        if self.policy == "least-loaded":
            return int(np.argmin(self.load))
        if self.policy == "affinity":
            return affinity_pick(
                self.load, (self.in_slots.get(adapter), self.in_host.get(adapter)), self.margin
            )
        return self._ray(adapter)

    def _ray(self, adapter: int) -> int:
        open_ = self.load < self.max_ongoing  # [replicas] below max_ongoing_requests
        holders = [r for r in sorted(self.in_host.get(adapter, ())) if open_[r]]
        if holders:
            candidates = holders
        elif open_.any():
            counts = np.where(open_, self.host_count, np.iinfo(np.int64).max)
            candidates = np.flatnonzero(counts == counts.min()).tolist()
        else:  # every replica full: the router waits; the first of two to have room takes it
            candidates = list(range(len(self.load)))
        if len(candidates) == 1:
            return candidates[0]
        a, b = self._random.sample(candidates, 2)
        return a if self.load[a] <= self.load[b] else b

    # ------------------------------------------------------------------------ the tiers

    def use(self, replica: int, adapter: int) -> str:
        """A request on ``replica`` starts with ``adapter``: where it was ("gpu", "host" or
        "disk"); afterwards it is in a slot and in host RAM, most recently used."""
        caches = self.caches[replica]
        tier = "gpu" if adapter in caches.slots else "host" if adapter in caches.host else "disk"
        if tier != "disk":
            caches.host.move_to_end(adapter)
        else:
            if len(caches.host) >= self.host:
                evicted = next(a for a in caches.host if a not in caches.slots)
                del caches.host[evicted]
                self.in_host[evicted].discard(replica)
                self.host_count[replica] -= 1
            caches.host[adapter] = None
            self.in_host.setdefault(adapter, set()).add(replica)
            self.host_count[replica] += 1
        if tier == "gpu":
            caches.slots.move_to_end(adapter)
        else:
            if len(caches.slots) >= self.slots:
                evicted = next(a for a in caches.slots if not caches.in_use.get(a))
                del caches.slots[evicted]
                self.in_slots[evicted].discard(replica)
            caches.slots[adapter] = None
            self.in_slots.setdefault(adapter, set()).add(replica)
        caches.in_use[adapter] = caches.in_use.get(adapter, 0) + 1
        return tier

    def done(self, replica: int, adapter: int) -> None:
        """A request with ``adapter`` on ``replica`` finished (its slot may be reused)."""
        in_use = self.caches[replica].in_use
        in_use[adapter] -= 1
        if not in_use[adapter]:
            del in_use[adapter]
