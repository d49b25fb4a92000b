"""Running engines beyond one: several base models in one process, engine replicas of a base
behind one dispatcher (no Qt, no HTTP)."""

from multilora_studio.deploy.base_pool import BasePool, BaseUnavailable, PoolBase, identify_base
from multilora_studio.deploy.replica_set import ReplicaSet, parse_devices, replicas_of, start_engine

__all__ = [
    "BasePool",
    "BaseUnavailable",
    "PoolBase",
    "ReplicaSet",
    "identify_base",
    "parse_devices",
    "replicas_of",
    "start_engine",
]
