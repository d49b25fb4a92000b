"""Running engines beyond one: several base models in one process (no Qt, no HTTP)."""

from multilora_studio.deploy.base_pool import BasePool, BaseUnavailable, PoolBase, identify_base

__all__ = ["BasePool", "BaseUnavailable", "PoolBase", "identify_base"]
